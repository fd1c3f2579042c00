"""GPU: the split-KV decode attention (``cuda.attention.decode``) through ``tracea.ops.attention`` on torch
tensors against a float64 reference on fresh random inputs: fp16 / bf16, head dims 64 and 128, GQA ratios
1-8 and MQA, seq_q 1..8, KV lengths that are not multiples of the tiles, causal (top-left), every hero and
forced split counts, boolean and additive masks with the scale argument, NaN / Inf placement, the Doctor's
choice for decode shapes, CUDA graph capture and replay (skipped without a GPU)."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_inputs as _inputs, attention_ref as _ref, graph_replays, rel as _rel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANT = "cuda.attention.decode"
TOL = {"float16": 4e-3, "bfloat16": 2e-2}


CASES = [  # (B, H, KVH, Sq, Skv, D)
    (1, 32, 8, 1, 4099, 128), (4, 32, 8, 1, 1000, 64), (2, 8, 8, 1, 777, 128), (1, 16, 1, 1, 2049, 64),
    (3, 32, 8, 4, 3001, 128), (2, 8, 2, 8, 515, 64), (1, 12, 4, 3, 97, 128), (2, 4, 4, 1, 5, 128),
    (1, 8, 1, 2, 33333, 128), (1, 32, 8, 8, 8191, 128),
]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_decode_attention_matches_float64(dt, causal, case):
    import tracea

    q, k, v = _inputs(case, dt, sum(case) + causal)
    out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, _ref(q, k, v, causal=causal)) < TOL[dt]


@pytest.mark.parametrize("d", [64, 128])
def test_every_hero_and_forced_split_counts(d):
    """Every hero, other valid configs of the search space and split counts 1..64 (empty chunks included)."""
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_decode import FlashDecode
    from tracea_cuda.variants.base import hero
    from tracea_torch.adapter import device_of

    case = (2, 32, 8, 1, 5000, d)
    q, k, v = _inputs(case, "bfloat16", d)
    ref = _ref(q, k, v, scale=0.2)
    var = FlashDecode()
    op = AttentionOp(2, 32, 1, 5000, d, kv_heads=8, dtype="bfloat16", scale=0.2)
    profile = get_doctor().profile_for(device_of(q.device))
    extra = [hero(16, bn, d, st, w, splits=s) for bn, w, st, s in
             ((16, 2, 2, 1), (32, 8, 2, 2), (16, 4, 3, 7), (32, 2, 6, 64), (16, 1, 4, 13), (16, 8, 8, 3))]
    configs = var.hero_configs(op, profile) + [c for c in extra if var.validate_config(op, c, profile)]
    assert len(configs) >= len(var.hero_configs(op, profile)) + 4
    for cfg in configs:
        out = tracea.ops.attention(q, k, v, enable_gqa=True, scale=0.2, variant=VARIANT, config=cfg)
        assert _rel(out, ref) < TOL["bfloat16"], cfg.key


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_decode_masks_and_scale(kind):
    import torch

    import tracea

    g = torch.Generator(device="cuda").manual_seed(3)
    # the mask tile travels through cp.async when its rows are 16-byte aligned (seq_kv % 8 == 0), as one row
    # when every row of a block reads the same mask row (mask_heads 1, seq_q 1), else 16 rows; plain loads
    # otherwise (seq_kv 257, 1999)
    for b, h, kvh, sq, skv, d, mshape in [(2, 8, 2, 1, 3000, 128, (2, 1, 1, 3000)), (1, 8, 8, 5, 257, 64, (5, 257)),
                                          (2, 4, 4, 1, 1999, 128, (2, 4, 1, 1999)),
                                          (2, 8, 2, 1, 4096, 128, (2, 8, 1, 4096)),
                                          (1, 32, 8, 2, 1024, 64, (1, 32, 2, 1024))]:
        q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.float16, generator=g)
        if kind == "bool":
            mask = torch.rand(mshape, device="cuda", generator=g) < 0.7
        else:
            mask = (torch.rand(mshape, device="cuda", generator=g) * 3 - 2).half()
        out = tracea.ops.attention(q, k, v, mask, scale=0.1, enable_gqa=True, variant=VARIANT)
        assert _rel(out, _ref(q, k, v, mask, scale=0.1)) < TOL["float16"], (b, h, kvh, sq, skv, d)


def test_decode_mask_with_an_unaligned_base():
    """A packed mask whose base is 2 bytes past an aligned address (seq_kv a multiple of 8): the kernel sees
    its rows are not 16-byte aligned and copies them with plain loads."""
    import torch

    import tracea

    q, k, v = _inputs((2, 32, 8, 1, 4096, 128), "bfloat16", 9)
    store = torch.empty(2 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    mask = store[1:].view(2, 1, 1, 4096)
    mask.copy_(torch.rand(2, 1, 1, 4096, device="cuda") * 4 - 3)
    assert mask.data_ptr() % 16 == 2 and mask.is_contiguous()
    out = tracea.ops.attention(q, k, v, mask, enable_gqa=True, variant=VARIANT)
    assert _rel(out, _ref(q, k, v, mask)) < TOL["bfloat16"]


def test_decode_fully_masked_rows_and_nonfinite():
    import torch

    import tracea
    from tracea.testing import nonfinite_mismatch

    q, k, v = _inputs((1, 8, 2, 1, 3000, 64), "float16", 5)
    mask = torch.ones(1, 8, 1, 3000, dtype=torch.bool, device="cuda")
    mask[0, 3] = False  # head 3: every key masked -> zeros, as PyTorch
    out = tracea.ops.attention(q, k, v, mask, enable_gqa=True, variant=VARIANT)
    assert torch.all(out[0, 3] == 0)
    assert _rel(out, _ref(q, k, v, mask)) < TOL["float16"]
    for name, pos in (("q", (0, 1, 0, 3)), ("k", (0, 0, 11, 5)), ("v", (0, 1, 2900, 2)), ("k", (0, 1, 2999, 1))):
        qq, kk, vv = q.clone(), k.clone(), v.clone()
        {"q": qq, "k": kk, "v": vv}[name][pos] = float("nan")
        kk[0, 1, 1500, 0] = float("inf")
        got = tracea.ops.attention(qq, kk, vv, enable_gqa=True, variant=VARIANT).double().cpu().numpy()
        ref = _ref(qq, kk, vv).numpy()
        msg = nonfinite_mismatch(got, ref, atol=2e-2)
        assert msg is None, f"NaN in {name} at {pos}: {msg}"


def test_default_path_picks_the_decode_kernel():
    import torch

    import tracea

    for case in ((1, 32, 8, 1, 4096, 128), (4, 32, 8, 1, 8192, 64), (2, 32, 8, 8, 4096, 128)):
        q, k, v = _inputs(case, "bfloat16", 7)
        forced = tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT)
        dflt = tracea.ops.attention(q, k, v, enable_gqa=True)
        torch.testing.assert_close(dflt, forced, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay_equals_eager():
    import torch

    import tracea

    q, k, v = _inputs((2, 32, 8, 1, 6000, 128), "bfloat16", 11)
    for seed, out in graph_replays(lambda: tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT), (q, k, v)):
        eager = tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT)
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
        assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"], seed

def test_split_launches_on_two_streams_at_once():
    """Each stream has its own arrival counts: launches queued on two streams without synchronisation give
    each stream's own inputs' result."""
    import torch

    import tracea

    shape = (1, 32, 8, 1, 20000, 128)
    ins = [_inputs(shape, "bfloat16", seed) for seed in (21, 22)]
    refs = [_ref(*x) for x in ins]
    tracea.ops.attention(*ins[0], enable_gqa=True, variant=VARIANT)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    outs: list = [[], []]
    for _ in range(20):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                outs[i].append(tracea.ops.attention(*ins[i], enable_gqa=True, variant=VARIANT))
    torch.cuda.synchronize()
    for i in (0, 1):
        for out in outs[i]:
            assert _rel(out, refs[i]) < TOL["bfloat16"]
