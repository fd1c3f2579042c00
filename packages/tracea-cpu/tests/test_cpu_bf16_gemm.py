"""bf16 GEMM (``cpu.gemm.avx512bf16``) against a float64 reference computed from the bf16 inputs: odd
and tiny shapes (odd K exercises the zero-padded last k pair), transposes, batches, every epilogue,
both output dtypes, every hero tile and small cache blocks so every blocking loop and edge path runs.
Inputs are torch CPU bf16 tensors (the way users pass bf16 without ml_dtypes)."""

from __future__ import annotations

import pytest

from tracea_cpu.bf16 import CpuGemmBf16Variant
from tracea_cpu.spaces import BF16_HEROES
from tracea_cpu.testing import HAVE_CC, PROFILE, config, rel_err, run_bf16_gemm

torch = pytest.importorskip("torch")
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
              pytest.mark.skipif(not PROFILE.has("avx512_bf16"), reason="this CPU lacks avx512_bf16")]

VARIANT = CpuGemmBf16Variant()
SHAPES = [(1, 1, 1), (7, 7, 7), (1, 33, 129), (33, 1, 7), (17, 33, 65), (33, 129, 129), (97, 131, 257),
          (2, 97, 3), (13, 61, 1), (64, 64, 64), (6, 64, 2)]


def bf16_case(m, n, k, *, ret_out=False, **kw):
    """Relative error (and with ``ret_out`` the output) of a bf16 GEMM through the AVX512_BF16 variant
    (:func:`~tracea_cpu.testing.run_bf16_gemm`)."""
    res, ref = run_bf16_gemm(VARIANT, m, n, k, **kw)
    err = rel_err(res.float().numpy(), ref)
    return (err, res) if ret_out else err


@pytest.mark.parametrize("out,tol", [("float32", 1e-5), ("bf16", 1e-2)])
@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_shapes(shape, out, tol):
    assert bf16_case(*shape, out=out) < tol


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_transposes(ta, tb, out):
    for shape in [(17, 33, 65), (64, 48, 40), (5, 70, 33), (40, 16, 48)]:
        assert bf16_case(*shape, ta=ta, tb=tb, out=out) < (1e-5 if out == "float32" else 1e-2), shape


@pytest.mark.parametrize("epi", ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_epilogues(epi, out):
    for shape in [(17, 33, 65), (40, 64, 33)]:
        assert bf16_case(*shape, epi=epi, out=out, seed=3) < (1e-5 if out == "float32" else 1e-2), (epi, shape)


@pytest.mark.parametrize("bias_dtype", ["float32", "bfloat16"])
def test_bf16_bias_in_fp32_or_bf16(bias_dtype):
    assert bf16_case(23, 45, 37, epi="bias+relu", bias_dtype=bias_dtype, out="bf16") < 1e-2
    assert bf16_case(23, 45, 37, epi="bias", bias_dtype=bias_dtype) < 1e-5


@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_batched_transposed_with_bias(out):
    assert bf16_case(23, 45, 37, batch=3, ta=True, tb=True, epi="bias+gelu_tanh", out=out) < \
        (1e-5 if out == "float32" else 1e-2)


@pytest.mark.parametrize("hero", range(len(BF16_HEROES)))
def test_bf16_every_hero_tile(hero):
    cfg = config(**BF16_HEROES[hero], threads=0)
    assert bf16_case(53, 101, 77, cfg=cfg, epi="silu") < 1e-5
    assert bf16_case(53, 101, 77, cfg=cfg, epi="silu", out="bf16") < 1e-2


@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_small_blocks_exercise_every_loop(out):
    # kc = 16 (odd K across several K blocks: the bf16 output then goes through the fp32 workspace),
    # mc / nc of two tiles, 2 threads (the B panels split along k when panels are few).
    for mr, nr in [(6, 64), (14, 32)]:
        cfg = config(mr=mr, nr=nr, mc=2 * mr, nc=2 * nr, kc=16, threads=2)
        for shape in [(5 * mr + 3, 3 * nr + 5, 61), (2 * mr, 2 * nr, 32), (mr - 1, nr + 1, 17)]:
            err = bf16_case(*shape, cfg=cfg, epi="bias+relu", out=out, batch=2)
            assert err < (1e-5 if out == "float32" else 1e-2), (mr, nr, shape)


def test_bf16_output_is_round_to_nearest_even_of_the_fp32_result():
    # Same config, same accumulation order: the bf16 output must be exactly the RNE rounding of the
    # fp32 one (torch's float32 -> bfloat16 conversion rounds to nearest even).
    for shape, kc in [((37, 70, 129), 2048), ((37, 70, 129), 32)]:
        cfg = config(mr=6, nr=64, mc=48, nc=4096, kc=kc, threads=1)
        _, f32 = bf16_case(*shape, cfg=cfg, epi="bias+gelu_erf", ret_out=True, seed=7)
        _, b16 = bf16_case(*shape, cfg=cfg, epi="bias+gelu_erf", out="bf16", ret_out=True, seed=7)
        assert torch.equal(f32.bfloat16().view(torch.int16), b16.view(torch.int16))


def test_bf16_large_multi_threaded():
    assert bf16_case(300, 257, 601, epi="bias") < 1e-5
    assert bf16_case(300, 257, 601, epi="bias", out="bf16") < 1e-2


@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_few_panels_split_packing_along_k(out):
    # N <= NR gives one B panel: its packing is split along k between the threads (odd K: the last
    # slice ends on a half pair).
    cfg = config(mr=6, nr=64, mc=48, nc=4096, kc=2048, threads=2)
    for shape in [(100, 50, 601), (37, 64, 1001), (64, 17, 256)]:
        for tb in (False, True):
            err = bf16_case(*shape, tb=tb, cfg=cfg, out=out, epi="bias")
            assert err < (1e-5 if out == "float32" else 1e-2), (shape, tb)


@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_bf16_few_rows_against_transposed_weights(out):
    # M <= 256 with a transposed B (nn.Linear weights) takes the per-thread-panel driver: one K block
    # and several (kc = 32: partial sums, the bf16 output through the fp32 workspace), odd K, edges.
    for kc in (2048, 32):
        cfg = config(mr=4, nr=64, mc=72, nc=4096, kc=kc, threads=2)
        for shape in [(1, 300, 129), (7, 257, 64), (100, 320, 77), (256, 270, 33)]:
            err = bf16_case(*shape, tb=True, cfg=cfg, out=out, epi="bias+relu", batch=2)
            assert err < (1e-5 if out == "float32" else 1e-2), (shape, kc)


def test_bf16_concurrent_calls_from_python_threads():
    # ctypes releases the GIL: concurrent calls must not share the packing workspace or the fp32
    # partial-sum workspace of a bf16 output (kc = 32: several K blocks).
    from concurrent.futures import ThreadPoolExecutor

    cfg = config(mr=6, nr=64, mc=48, nc=4096, kc=32, threads=1)

    def one(seed):
        return bf16_case(61 + seed, 70, 90 + seed, epi="bias+relu", out="bf16", cfg=cfg, seed=seed,
                         tb=bool(seed % 2))

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = list(pool.map(one, range(8)))
    assert max(errors) < 1e-2, errors


@pytest.mark.parametrize("out", ["float32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1, 2), (7, 65, 130), (53, 101, 78), (300, 64, 4096), (5, 1000, 2)])
def test_bf16_direct_form_against_transposed_weights(shape, out):
    """``direct=1`` (x @ W.T: A read in place, the weight as VNNI panels): odd M and N, K even down to one pair,
    bias in the output dtype, both tiles of the heroes."""
    from tracea.ir.ops import GemmOp

    op = GemmOp(*shape, trans_b=True, dtype_a="bf16", dtype_b="bf16")
    cfgs = [c for c in VARIANT.hero_configs(op, PROFILE) if c.get("direct")]
    assert cfgs, "the direct form goes first for x @ W.T with an even K"
    for cfg in cfgs:
        err = bf16_case(*shape, tb=True, cfg=cfg, out=out, epi="bias+relu",
                        bias_dtype="bfloat16" if out == "bf16" else "float32")
        assert err < (1e-5 if out == "float32" else 1e-2), (shape, cfg.key)


def test_bf16_direct_form_declines_and_keeps_weights():
    from tracea.ir.ops import GemmOp

    import tracea
    from tracea_cpu.panel_cache import PANELS

    cfg = config(**BF16_HEROES[0], threads=0, direct=1)
    for op in (GemmOp(8, 64, 63, trans_b=True, dtype_a="bf16", dtype_b="bf16"),  # odd K
               GemmOp(8, 64, 64, dtype_a="bf16", dtype_b="bf16"),  # B stored (K, N)
               GemmOp(8, 64, 64, batch=2, trans_b=True, dtype_a="bf16", dtype_b="bf16")):
        assert not VARIANT.validate_config(op, cfg, PROFILE), op.describe()
        assert not any(c.get("direct") for c in VARIANT.hero_configs(op, PROFILE))
    PANELS.clear()
    x, w = torch.randn(33, 256).bfloat16(), torch.randn(96, 256).bfloat16()
    for step in range(4):  # the panels are kept from the second call; an in-place update of the weight is seen
        if step == 2:
            w.add_(1.0)
        y = tracea.ops.matmul(x, w.t(), variant=VARIANT.name, config=cfg)
        ref = x.double() @ w.double().t()
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, step
    assert len(PANELS) == 1
