"""GPU: the flash-attention forward (``cuda.attention.flash_mma``) through ``tracea.ops.attention`` on torch
tensors, against a float64 reference on fresh random inputs: fp16 / bf16, head dims 32, 64 and 128, causal and
not, GQA / MQA, seq_q != seq_kv and lengths that are not multiples of the tiles, one-token decode over a
long KV cache (split-KV), the scale argument, boolean and additive masks, NaN / Inf placement (skipped
without a GPU)."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_ref as _ref, rel as _rel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANT = "cuda.attention.flash_mma"
TOL = {"float16": 4e-3, "bfloat16": 2e-2}


CASES = [  # (B, H, KVH, Sq, Skv, D)
    (2, 4, 4, 128, 128, 64), (1, 8, 2, 200, 333, 128), (2, 4, 1, 77, 77, 64), (1, 2, 2, 1000, 129, 128),
    (3, 4, 2, 65, 1000, 64), (1, 32, 8, 1, 4099, 128), (2, 8, 8, 1, 777, 64), (1, 4, 4, 17, 5, 128),
    # head dim 32 (Swin / PVT / TinyViT): ViT tokens, 7x7 windows, PVT's reduced keys, GQA decode
    (2, 3, 3, 197, 197, 32), (16, 4, 4, 49, 49, 32), (1, 2, 2, 3136, 49, 32), (4, 4, 2, 1, 250, 32),
]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_flash_attention_matches_float64(dt, causal, case):
    import torch

    import tracea

    b, h, kvh, sq, skv, d = case
    g = torch.Generator(device="cuda").manual_seed(sum(case) + causal)
    dtype = getattr(torch, dt)
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, kvh, skv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, kvh, skv, d, device="cuda", dtype=dtype, generator=g)
    out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT)
    assert out.shape == q.shape and out.dtype == dtype
    assert _rel(out, _ref(q, k, v, causal=causal)) < TOL[dt]
    # the default path runs a kernel too (no fallback): this one, or on Hopper cuda.attention.wgmma where it
    # serves the shape, so the same numbers up to rounding
    dflt = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert _rel(dflt, _ref(q, k, v, causal=causal)) < TOL[dt]


@pytest.mark.parametrize("splits", [1, 2, 7, 64])
def test_flash_attention_decode_split_counts(splits):
    """Any split count gives the same result (chunks of whole key tiles; empty chunks included)."""
    import torch

    import tracea
    from tracea_cuda.variants.base import hero

    g = torch.Generator(device="cuda").manual_seed(splits)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 8, 5000, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(2, 8, 5000, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    for bm in (16, 64):
        cfg = hero(bm, 64, 128, 2, bm // 16, mt=1, splits=splits)
        out = tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT, config=cfg)
        assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"], (bm, splits)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_flash_attention_masks_and_scale(kind):
    import torch

    import tracea

    g = torch.Generator(device="cuda").manual_seed(3)
    for b, h, kvh, sq, skv, d, mshape in [(2, 4, 2, 70, 130, 64, (2, 1, 70, 130)), (1, 8, 8, 33, 257, 128, (33, 257)),
                                          (2, 4, 4, 1, 3000, 128, (2, 4, 1, 3000)),
                                          (8, 3, 3, 49, 49, 32, (8, 1, 49, 49))]:  # Swin's shifted-window mask
        q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        if kind == "bool":
            mask = torch.rand(mshape, device="cuda", generator=g) < 0.7
        else:
            mask = (torch.rand(mshape, device="cuda", generator=g) * 3 - 2).bfloat16()
        out = tracea.ops.attention(q, k, v, mask, scale=0.1, enable_gqa=True, variant=VARIANT)
        assert _rel(out, _ref(q, k, v, mask, scale=0.1)) < TOL["bfloat16"], (b, h, kvh, sq, skv, d)


def test_flash_attention_fully_masked_rows_and_nonfinite():
    import torch

    import tracea
    from tracea.testing import nonfinite_mismatch

    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(1, 2, 90, 64, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(1, 2, 90, 64, device="cuda", dtype=torch.float16, generator=g)
    mask = torch.ones(40, 90, dtype=torch.bool, device="cuda")
    mask[3] = False
    out = tracea.ops.attention(q, k, v, mask, variant=VARIANT)
    assert torch.all(out[:, :, 3] == 0)
    for name, pos in (("q", (0, 1, 7, 3)), ("k", (0, 0, 11, 5)), ("v", (0, 1, 80, 2))):
        qq, kk, vv = q.clone(), k.clone(), v.clone()
        {"q": qq, "k": kk, "v": vv}[name][pos] = float("nan")
        kk[0, 1, 30, 0] = float("inf")
        got = tracea.ops.attention(qq, kk, vv, variant=VARIANT).double().cpu().numpy()
        ref = _ref(qq, kk, vv).numpy()
        msg = nonfinite_mismatch(got, ref, atol=2e-2)
        assert msg is None, f"NaN in {name}: {msg}"


def test_flash_attention_many_windows():
    """Swin-style window attention: 2048 sequences (batch 32 x 64 windows) of 49 tokens, head dim 32 (grid z
    holds the batch); a split-KV config asked for is capped to fit it."""
    import torch

    import tracea
    from tracea_cuda.variants.base import hero

    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2048, 3, 49, 32, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    ref = _ref(q, k, v)
    for cfg in (None, hero(64, 64, 32, 2, 4, mt=1, splits=64)):
        out = tracea.ops.attention(q, k, v, variant=VARIANT, config=cfg)
        assert _rel(out, ref) < TOL["float16"], cfg
    assert _rel(tracea.ops.attention(q, k, v), ref) < TOL["float16"]  # the default path serves it too
