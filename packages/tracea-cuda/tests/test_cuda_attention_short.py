"""GPU (Hopper): the short-sequence tiles of ``cuda.attention.wgmma`` -- one consumer warpgroup (``tile_m``
64) with two or three CTAs per SM (param ``ctas``), one- to three-deep K / V rings -- through
``tracea.ops.attention`` on torch tensors against a float64 reference on fresh random inputs: odd lengths
(1, 7, 63, 65, 197, 255, 257), causal and not, GQA / MQA, seq_q != seq_kv, packed and strided (Hugging
Face BSHD, timm ViT qkv) operands, the log-sum-exp, NaN / Inf placement, masks (served by flash_mma on the
default path), CUDA graph replay, and the default path's pick for short sequences.
Skipped without a GPU of compute capability 9.0."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_inputs as _inputs, attention_ref as _ref, graph_replays, rel as _rel

VARIANT = "cuda.attention.wgmma"
TOL = {"float16": 4e-3, "bfloat16": 2e-2}


pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not T.hopper_available(), reason="needs a Hopper GPU (sm_90), CuPy and torch")]


def _short_configs(d: int) -> list:
    """tile_m 64 configs: two and three CTAs per SM, 1-3 stages, 64..128-key tiles, persistent, no overlap,
    and the O tile staged in shared memory (``ostage``); at D128 also the two-warpgroup staged tile the short
    heroes lead with."""
    from tracea_cuda.variants.base import hero

    def c(bn: int, st: int, ctas: int, **kw: object) -> object:
        return hero(64, bn, d, st, 8, pingpong=False, ctas=ctas, **kw)

    if d == 64:
        return [c(64, 2, 2), c(128, 1, 2), c(96, 2, 2), c(64, 3, 3), c(128, 2, 2, persistent=True),
                c(64, 2, 2, overlap=False), c(80, 2, 3, persistent=True, ostage=True)]
    return [c(64, 2, 2), c(128, 1, 2), c(80, 2, 2, persistent=True), c(64, 2, 2, overlap=False),
            hero(128, 128, d, 2, 12, persistent=True, ostage=True), c(64, 2, 2, persistent=True, ostage=True),
            c(128, 1, 2, ostage=True)]


CASES = [  # (B, H, KVH, Sq, Skv, D): odd lengths around the 64-row / 64..128-key tiles, GQA / MQA, Sq != Skv
    (3, 4, 4, 1, 1, 64), (2, 4, 2, 7, 7, 128), (2, 6, 6, 63, 63, 64), (2, 4, 1, 65, 65, 128),
    (4, 6, 6, 197, 197, 64), (2, 8, 2, 255, 255, 128), (2, 4, 4, 257, 257, 64), (1, 8, 8, 200, 333, 128),
    (2, 4, 4, 300, 77, 64), (40, 12, 12, 128, 128, 64),
]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_short_tiles_match_float64(dt, causal, case):
    import tracea

    q, k, v = _inputs(case, dt, sum(case) + causal + len(dt))
    ref = _ref(q, k, v, causal=causal, scale=0.2)
    for cfg in _short_configs(case[-1]):
        out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.2, variant=VARIANT, config=cfg)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert _rel(out, ref) < TOL[dt], cfg.key


LAYOUT_CASES = [("vit", 4, 6, 6, 197, 197, 64), ("bshd", 3, 12, 12, 255, 255, 64), ("bshd", 2, 8, 2, 65, 129, 128),
                ("vit", 2, 4, 4, 257, 257, 128)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=[str(c) for c in LAYOUT_CASES])
def test_short_tiles_on_strided_operands(case, causal):
    """timm's packed qkv and Hugging Face's BSHD views read through their strides by the tile_m 64 kernels;
    the output comes back in q's storage order."""
    import torch

    import tracea

    kind, b, h, kvh, sq, skv, d = case
    g = torch.Generator(device="cuda").manual_seed(sq + d + causal)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=g)

    if kind == "vit":
        q, k, v = rnd(b, sq, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q, k, v = (rnd(b, sq, h, d).transpose(1, 2), rnd(b, skv, kvh, d).transpose(1, 2),
                   rnd(b, skv, kvh, d).transpose(1, 2))
    ref = _ref(q, k, v, causal=causal)
    for cfg in _short_configs(d):
        out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=kvh != h, variant=VARIANT, config=cfg)
        assert out.transpose(1, 2).is_contiguous(), cfg.key
        assert _rel(out, ref) < TOL["float16"], cfg.key


@pytest.mark.parametrize("d", [64, 128])
def test_short_tiles_log_sum_exp(d):
    import tracea
    from tracea_cuda.testing_attention import lse_close

    q, k, v = _inputs((2, 8, 4, 197, 255, d), "bfloat16", d)
    for causal in (False, True):
        ref, ref_lse = _ref(q, k, v, causal=causal, return_lse=True)
        for cfg in _short_configs(d)[:3] + _short_configs(d)[-2:]:
            out, lse = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT, config=cfg,
                                            return_lse=True)
            assert _rel(out, ref) < TOL["bfloat16"], cfg.key
            assert lse_close(lse, ref_lse) is None, (cfg.key, lse_close(lse, ref_lse))


def test_short_tiles_propagate_nonfinite_values():
    import tracea
    from tracea.testing import nonfinite_mismatch

    q, k, v = _inputs((1, 2, 2, 140, 197, 64), "float16", 5)
    for cfg in _short_configs(64)[:3] + _short_configs(64)[-1:]:
        for causal in (False, True):
            vpos = (0, 1, 40, 2) if causal else (0, 1, 190, 2)
            for name, pos in (("q", (0, 1, 7, 3)), ("k", (0, 0, 11, 5)), ("v", vpos), ("k", (0, 1, 196, 1))):
                qq, kk, vv = q.clone(), k.clone(), v.clone()
                {"q": qq, "k": kk, "v": vv}[name][pos] = float("nan")
                kk[0, 1, 30, 0] = float("inf")
                got = tracea.ops.attention(qq, kk, vv, is_causal=causal, variant=VARIANT, config=cfg)
                msg = nonfinite_mismatch(got.double().cpu().numpy(), _ref(qq, kk, vv, causal=causal).numpy(), atol=2e-2)
                assert msg is None, f"{cfg.key}: NaN in {name} at {pos}, causal={causal}: {msg}"


def test_short_tiles_replay_in_a_cuda_graph():
    import tracea

    q, k, v = _inputs((4, 12, 12, 197, 197, 64), "bfloat16", 3)
    for cfg in _short_configs(64)[:2] + _short_configs(64)[-1:]:
        call = lambda c=cfg: tracea.ops.attention(q, k, v, variant=VARIANT, config=c)  # noqa: E731
        for seed, out in graph_replays(call, (q, k, v)):
            assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"], (cfg.key, seed)


@pytest.mark.parametrize("case", [(8, 12, 12, 256, 256, 64), (32, 6, 6, 197, 197, 64), (1, 6, 6, 197, 197, 64),
                                  (4, 16, 16, 384, 384, 128),
                                  (1, 16, 4, 512, 512, 128)], ids=str)
def test_default_path_serves_short_sequences_with_the_short_tiles(case):
    """Untuned, the default path runs the wgmma kernel's first hero -- a tile_m 64 config for short
    sequences, or at D128 the staged 128x128 one where its blocks fill the SMs -- and matches the forced call bit for bit; with a mask the default path (flash_mma) still
    matches the reference."""
    import torch

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_torch.adapter import device_of

    b, h, kvh, s, _, d = case
    q, k, v = _inputs(case, "bfloat16", s + d)
    profile = get_doctor().profile_for(device_of(q.device))
    for causal in (False, True):
        op = AttentionOp(b, h, s, s, d, kv_heads=kvh, causal=causal, dtype="bfloat16")
        first = FlashAttentionWgmma().hero_configs(op, profile)[0]
        assert first.tile_m == 64 or (d == 128 and first.get("ostage")), first.key  # D128: 128x128, O staged
        dflt = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True)
        forced = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT, config=first)
        torch.testing.assert_close(dflt, forced, atol=0, rtol=0)
        assert _rel(dflt, _ref(q, k, v, causal=causal)) < TOL["bfloat16"]
    mask = torch.rand(b, 1, s, s, device="cuda") < 0.7
    mask[..., 0] = True
    got = tracea.ops.attention(q, k, v, mask, enable_gqa=True)
    assert _rel(got, _ref(q, k, v, mask)) < TOL["bfloat16"]


MID_CASES = [(1, 8, 8, 700, 700, 64), (2, 4, 2, 600, 1100, 128), (1, 6, 6, 1500, 1500, 64),
             (1, 4, 4, 1025, 1025, 128)]


@pytest.mark.parametrize("case", MID_CASES, ids=str)
def test_mid_length_small_grid_heroes_match_float64(case):
    """Mid-length prefills on small grids (past SHORT_KV keys, the long heroes' row blocks in few waves):
    every config :meth:`FlashAttentionWgmma.mid_heroes` offers, odd lengths, GQA, seq_q != seq_kv, causal
    and not, against the float64 reference; untuned, the default path runs the first hero bit for bit."""
    import torch

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_torch.adapter import device_of

    b, h, kvh, sq, skv, d = case
    q, k, v = _inputs(case, "bfloat16", sq + d)
    profile = get_doctor().profile_for(device_of(q.device))
    w = FlashAttentionWgmma()
    for causal in (False, True):
        op = AttentionOp(b, h, sq, skv, d, kv_heads=kvh, causal=causal, dtype="bfloat16")
        assert w.few_waves(op, profile), op.describe()
        ref = _ref(q, k, v, causal=causal)
        for cfg in w.mid_heroes(op, profile):
            out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT, config=cfg)
            assert _rel(out, ref) < TOL["bfloat16"], cfg.key
        first = w.hero_configs(op, profile)[0]
        dflt = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True)
        forced = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT, config=first)
        torch.testing.assert_close(dflt, forced, atol=0, rtol=0)
        assert _rel(dflt, ref) < TOL["bfloat16"]
