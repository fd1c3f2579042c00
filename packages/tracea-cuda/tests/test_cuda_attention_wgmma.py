"""GPU (Hopper): the wgmma flash-attention forward (``cuda.attention.wgmma``) through ``tracea.ops.attention``
on torch tensors against a float64 reference on fresh random inputs: fp16 / bf16, head dims 64 and 128,
causal and not, GQA / MQA, seq_q != seq_kv and lengths that are not multiples of the tiles, every hero
config, NaN / Inf placement, misaligned arrays (refused), CUDA graph capture and replay.
Skipped without a GPU of compute capability 9.0."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_inputs as _inputs, attention_ref as _ref, graph_replays, rel as _rel

VARIANT = "cuda.attention.wgmma"
TOL = {"float16": 4e-3, "bfloat16": 2e-2}


pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not T.hopper_available(), reason="needs a Hopper GPU (sm_90), CuPy and torch")]


CASES = [  # (B, H, KVH, Sq, Skv, D): odd lengths, GQA / MQA packing across heads, seq_q != seq_kv
    (2, 4, 4, 128, 128, 64), (1, 8, 2, 200, 333, 128), (2, 4, 1, 77, 77, 64), (1, 2, 2, 1000, 129, 128),
    (2, 6, 3, 300, 1000, 64), (1, 4, 4, 513, 5, 128), (1, 16, 16, 1024, 1024, 128), (2, 8, 2, 100, 401, 64),
]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_wgmma_attention_matches_float64(dt, causal, case):
    import tracea

    q, k, v = _inputs(case, dt, sum(case) + causal)
    out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, _ref(q, k, v, causal=causal)) < TOL[dt]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_hero_config_and_the_search_space(d, causal):
    """Every hero and a few other valid configs (tile_m 128 / 192, tile_n 64..192, 2-4 stages)."""
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero
    from tracea_torch.adapter import device_of

    case = (1, 4, 2, 555, 700, d)
    q, k, v = _inputs(case, "bfloat16", d + causal)
    ref = _ref(q, k, v, causal=causal, scale=0.3)
    var = FlashAttentionWgmma()
    op = AttentionOp(1, 4, 555, 700, d, kv_heads=2, causal=causal, dtype="bfloat16", scale=0.3)
    profile = get_doctor().profile_for(device_of(q.device))
    extra = [hero(128, 64, d, 4, 12), hero(192, 64, d, 3, 16), hero(128, 160, d, 2, 12),
             hero(192, 96, d, 2, 16, persistent=True), hero(128, 128, d, 2, 12, pingpong=False, persistent=True),
             hero(192, 96, d, 2, 16, overlap=True), hero(128, 176, d, 2, 12, overlap=False, pingpong=False)]
    configs = var.hero_configs(op, profile) + [c for c in extra if var.validate_config(op, c, profile)]
    for cfg in configs:
        out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.3, variant=VARIANT, config=cfg)
        assert _rel(out, ref) < TOL["bfloat16"], cfg.key


PERSISTENT_CASES = [(2, 16, 4, 1000, 777, 128), (3, 12, 12, 700, 900, 64), (1, 8, 1, 2500, 301, 128)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=[str(c) for c in PERSISTENT_CASES])
def test_persistent_grid_walks_more_items_than_ctas(case, causal):
    """More query blocks than SMs: each persistent CTA runs several items, the K / V rings and the Q
    buffer carry over from one item to the next."""
    import tracea
    from tracea_cuda.variants.base import hero

    d = case[-1]
    q, k, v = _inputs(case, "bfloat16", sum(case) + causal)
    ref = _ref(q, k, v, causal=causal)
    for cfg in (hero(128, 128, d, 2, 12, persistent=True), hero(192, 96 if d == 64 else 64, d, 3, 16, persistent=True),
                hero(128, 176 if d == 128 else 192, d, 2, 12, persistent=True)):
        out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=VARIANT, config=cfg)
        assert _rel(out, ref) < TOL["bfloat16"], cfg.key


# (B, H, KVH, Sq, Skv, D), causal: persistent grids over 1.6..3.9 waves of items (on 132 SMs), the last wave
# partial in an odd wave (dealt backwards) and an even one, GQA blocks that straddle heads, odd lengths
LPT_CASES = [(2, 16, 4, 1000, 777, 128), (3, 12, 12, 700, 900, 64), (4, 8, 8, 600, 600, 128),
             (4, 16, 16, 900, 900, 128), (8, 16, 16, 384, 384, 128), (5, 7, 7, 333, 501, 64)]


@pytest.mark.parametrize("case", LPT_CASES, ids=[str(c) for c in LPT_CASES])
def test_causal_longest_first_order_runs_every_item_once(case):
    """``lpt`` (on by default for persistent causal grids): the items longest first over all heads, dealt to
    the persistent CTAs in snake order (every other wave backwards); off, the 8-head groups of the plain
    grid. Every row is written once (the output starts as NaN) and matches the float64 reference, for the
    two-warpgroup and the one-warpgroup (two CTAs per SM) tiles, persistent or not, and with the
    log-sum-exp."""
    import torch

    import tracea
    from tracea_cuda.testing_attention import lse_close
    from tracea_cuda.variants.base import hero

    d = case[-1]
    q, k, v = _inputs(case, "bfloat16", sum(case) + 5)
    ref, ref_lse = _ref(q, k, v, causal=True, return_lse=True)
    configs = [hero(128, 128, d, 2, 12, persistent=True, ostage=True), hero(128, 128, d, 2, 12, persistent=True),
               hero(128, 128, d, 2, 12, persistent=True, lpt=False), hero(128, 128, d, 2, 12, lpt=True),
               hero(64, 64, d, 2, 8, pingpong=False, ctas=2, persistent=True, ostage=True),
               hero(192, 64, d, 2, 16, persistent=True)]
    for cfg in configs:
        out = torch.full_like(q, float("nan"))
        got = tracea.ops.attention(q, k, v, is_causal=True, enable_gqa=True, variant=VARIANT, config=cfg, out=out)
        assert got is out or got.data_ptr() == out.data_ptr()
        assert not out.isnan().any(), cfg.key
        assert _rel(out, ref) < TOL["bfloat16"], cfg.key
    out, lse = tracea.ops.attention(q, k, v, is_causal=True, enable_gqa=True, variant=VARIANT, config=configs[0],
                                    return_lse=True)
    assert _rel(out, ref) < TOL["bfloat16"] and lse_close(lse, ref_lse) is None


# (B, H, KVH, Sq, Skv, D): more items than SMs with a partial last wave (on 132 SMs: 160 items, 3 key tiles:
# one-tile runs, three pieces an item; 768 items of 19 tiles; GQA 1024 items; D64 704 items of 192 rows;
# 256 items of one key tile: every tail item whole in one run), and one with whole waves only
# Fewer items than SMs (a prefill chunk over a long KV cache, GQA 32/8: 64 items of 128 rows over 8192 keys;
# 24 items over 3000 keys; MQA 77-query blocks over 5000): every item cut, 2..4 pieces each.
TAIL_CASES = [(4, 8, 8, 600, 333, 128), (2, 16, 16, 3000, 3000, 128), (4, 32, 8, 1024, 1500, 128),
              (4, 16, 16, 2000, 2001, 64), (1, 8, 8, 4096, 1, 128), (2, 33, 33, 4096, 777, 128),
              (1, 32, 8, 256, 8192, 128), (1, 8, 8, 300, 3000, 64), (2, 4, 1, 77, 5000, 128)]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", TAIL_CASES, ids=[str(c) for c in TAIL_CASES])
def test_tail_split_matches_float64(case, dt):
    """``tail``: the items past the last whole wave cut along the keys (runs of one to many tiles, edge
    tiles past seq_kv, pieces merged by the last to arrive in piece order); ``edge_pv``: an item's (or
    piece's) last P V skips the 16-key groups past seq_kv (1 to all of a tile's k steps run here). The
    output and the log-sum-exp match the float64 reference, and repeated launches (the arrival counts back
    at zero) give the same bits."""
    import torch

    import tracea
    from tracea_cuda.testing_attention import lse_close
    from tracea_cuda.variants.base import hero

    d = case[-1]
    q, k, v = _inputs(case, dt, sum(case) + len(dt))
    ref, ref_lse = _ref(q, k, v, return_lse=True)
    shapes = [(128, 160), (128, 128)] if d == 128 else [(192, 128), (128, 128)]
    configs = [hero(bm, bn, d, 2, 4 * (bm // 64 + 1), persistent=p, **kw) for bm, bn in shapes
               for p, kw in ((True, {"tail": True}), (True, {"tail": True, "edge_pv": True}), (False, {"edge_pv": True}))]
    for cfg in configs:
        first = None
        for _ in range(3):
            out, lse = tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT, config=cfg, return_lse=True)
            assert _rel(out, ref) < TOL[dt], cfg.key
            assert lse_close(lse, ref_lse) is None, (cfg.key, lse_close(lse, ref_lse))
            if first is not None:
                torch.testing.assert_close(out, first, atol=0, rtol=0)
            first = out
        plain = tracea.ops.attention(q, k, v, enable_gqa=True, variant=VARIANT, config=cfg)
        assert _rel(plain, ref) < TOL[dt], cfg.key


def test_tail_split_propagates_nonfinite_values_and_replays_in_a_graph():
    """A NaN in a tail item's keys reaches its rows through the merge (the pieces' weights); the tail
    split captured in a CUDA graph (its counts and partials from buffers of the capture) replays right."""
    import tracea
    from tracea.testing import nonfinite_mismatch
    from tracea_cuda.variants.base import hero

    case = (4, 8, 8, 600, 333, 128)
    cfg = hero(128, 160, 128, 2, 12, persistent=True, tail=True, edge_pv=True)
    q, k, v = _inputs(case, "bfloat16", 21)
    kk = k.clone()
    kk[3, 7, 200, 5] = float("nan")  # the last (batch, head): its blocks are tail items on 132 SMs
    got = tracea.ops.attention(q, kk, v, variant=VARIANT, config=cfg).double().cpu().numpy()
    msg = nonfinite_mismatch(got, _ref(q, kk, v).numpy(), atol=2e-2)
    assert msg is None, msg
    for seed, out in graph_replays(lambda: tracea.ops.attention(q, k, v, variant=VARIANT, config=cfg), (q, k, v)):
        assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"], seed


def test_default_path_picks_the_wgmma_kernel_for_prefill():
    import torch

    import tracea

    q, k, v = _inputs((2, 8, 8, 1024, 1024, 128), "bfloat16", 7)
    for causal in (False, True):
        forced = tracea.ops.attention(q, k, v, is_causal=causal, variant=VARIANT)
        dflt = tracea.ops.attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(dflt, forced, atol=0, rtol=0)


def test_nonfinite_inputs_propagate_like_the_reference():
    import tracea
    from tracea.testing import nonfinite_mismatch

    q, k, v = _inputs((1, 2, 2, 140, 300, 64), "float16", 5)
    for causal in (False, True):
        # causal: a NaN in v only where every block loads it (keys after a block's last row are never
        # loaded, as in PyTorch's flash / cuDNN backends, while the reference multiplies their weight 0)
        vpos = (0, 1, 40, 2) if causal else (0, 1, 130, 2)
        for name, pos in (("q", (0, 1, 7, 3)), ("k", (0, 0, 11, 5)), ("v", vpos), ("k", (0, 1, 299, 1))):
            qq, kk, vv = q.clone(), k.clone(), v.clone()
            {"q": qq, "k": kk, "v": vv}[name][pos] = float("nan")
            kk[0, 1, 30, 0] = float("inf")
            got = tracea.ops.attention(qq, kk, vv, is_causal=causal, variant=VARIANT).double().cpu().numpy()
            ref = _ref(qq, kk, vv, causal=causal).numpy()
            msg = nonfinite_mismatch(got, ref, atol=2e-2)
            assert msg is None, f"NaN in {name} at {pos}, causal={causal}: {msg}"


def test_misaligned_arrays_are_refused_with_a_reason():
    import torch

    import tracea
    from tracea.errors import LaunchError

    q, k, v = _inputs((1, 4, 4, 256, 256, 64), "bfloat16", 9)
    buf = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    qm = buf[1:].view(q.shape)
    qm.copy_(q)
    with pytest.raises(LaunchError, match="aligned"):
        tracea.ops.attention(qm, k, v, variant=VARIANT)


def test_cuda_graph_capture_and_replay():
    import tracea

    q, k, v = _inputs((2, 4, 4, 384, 384, 128), "float16", 11)
    for seed, out in graph_replays(lambda: tracea.ops.attention(q, k, v, is_causal=True, variant=VARIANT), (q, k, v)):
        assert _rel(out, _ref(q, k, v, causal=True)) < TOL["float16"], seed

@pytest.mark.parametrize("scale", [1e-3, 0.3, 2.5])
def test_scale_argument(scale):
    """The scale folds into the exponent (row max on the raw scores): small and large scales."""
    import tracea

    q, k, v = _inputs((1, 4, 2, 200, 300, 128), "float16", 13)
    for causal in (False, True):
        out = tracea.ops.attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True, variant=VARIANT)
        assert _rel(out, _ref(q, k, v, causal=causal, scale=scale)) < TOL["float16"], (scale, causal)
