"""GPU tests of the CUDA GEMM variants against a float64 reference (skipped without a GPU)."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANTS = {v.name: v for v in all_variants()}
MODES = {  # (input dtype, fp32 precision) -> variant
    ("float16", "highest"): "cuda.gemm.mma_f16", ("bfloat16", "highest"): "cuda.gemm.mma_f16",
    ("float32", "high"): "cuda.gemm.mma_tf32", ("float32", "highest"): "cuda.gemm.mma_3xtf32",
}
SHAPES = [(1, 1, 1, 1), (7, 13, 5, 1), (64, 64, 64, 1), (127, 129, 65, 1), (200, 136, 264, 3),
          (333, 257, 200, 2), (1024, 1024, 1024, 1), (17, 2000, 300, 1)]


def _check(op: GemmOp, config=None, seed: int = 0) -> float:
    variant = VARIANTS[MODES[(op.dtype_a.value, op.fp32_precision.value)]]
    profile = T.gpu_profile()
    # few-row products against an (N, K) weight are routed to rows_fma (fp32-exact) or wgmma_fewrows_tf32 (TF32 on
    # Hopper); the tiled kernel still runs them
    routed = ("rows_fma serves", "wgmma_fewrows_tf32 serves")
    assert not [r for r in variant.check(op, profile) if not any(x in r for x in routed)], variant.check(op, profile)
    config = config or variant.hero_configs(op, profile)[0]
    t = T.gemm_inputs(op, seed)
    variant.run(op, config, T.op_args(t), profile)
    err = T.rel_err(t["out"], T.gemm_reference(op, t))
    tol = T.tolerance(math_mode(op.dtype_a, op.fp32_precision), op.out_dtype)
    assert err <= tol, f"{op.describe()} {config.key}: rel err {err:.3g} > {tol}"
    return err


@pytest.mark.parametrize("mode", list(MODES), ids=lambda m: f"{m[0]}-{m[1]}")
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)], ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_shapes_dtypes_transposes(mode, trans, shape):
    m, n, k, batch = shape
    dt, prec = mode
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], dtype_a=dt, dtype_b=dt,
                fp32_precision=prec, epilogue="bias+gelu")
    _check(op, seed=m * 7 + n)


@pytest.mark.parametrize("epilogue", ["none", "bias", "relu", "bias+relu", "bias+gelu", "bias+gelu_erf", "silu",
                                      "bias+silu", "gelu_erf"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32"])
def test_gemm_every_epilogue(epilogue, dt):
    prec = "highest"
    op = GemmOp(190, 264, 136, dtype_a=dt, dtype_b=dt, epilogue=epilogue, fp32_precision=prec)
    _check(op)


@pytest.mark.parametrize("dt,out", [("float16", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                                    ("float32", "float16"), ("float16", "bfloat16")])
def test_gemm_output_cast(dt, out):
    op = GemmOp(160, 96, 80, dtype_a=dt, dtype_b=dt, dtype_out=out, epilogue="bias+relu")
    _check(op)


@pytest.mark.parametrize("mode", list(MODES), ids=lambda m: f"{m[0]}-{m[1]}")
def test_every_hero_config(mode):
    dt, prec = mode
    op = GemmOp(300, 520, 264, dtype_a=dt, dtype_b=dt, fp32_precision=prec, epilogue="bias")
    variant = VARIANTS[MODES[mode]]
    for config in variant.hero_configs(op, T.gpu_profile()):
        _check(op, config)


def test_3xtf32_is_fp32_accurate_on_large_k():
    op = GemmOp(256, 256, 4096, fp32_precision="highest")
    assert _check(op) <= 1e-5


def test_repeated_runs_are_identical():
    import torch

    op = GemmOp(257, 129, 515, dtype_a="float16", dtype_b="float16")
    variant = VARIANTS["cuda.gemm.mma_f16"]
    t = T.gemm_inputs(op)
    cfg = variant.hero_configs(op, T.gpu_profile())[0]
    variant.run(op, cfg, T.op_args(t), T.gpu_profile())
    first = t["out"].clone()
    t["out"].fill_(float("nan"))
    variant.run(op, cfg, T.op_args(t), T.gpu_profile())
    assert torch.equal(first, t["out"])


def test_dtype_names():
    assert DType.parse("bf16") is DType.BF16


WGMMA_SHAPES = [(8, 8, 8, 1), (128, 256, 64, 1), (136, 264, 72, 1), (1000, 1016, 520, 2), (264, 136, 2000, 1),
                (2048, 2048, 1024, 1), (4096, 2048, 4096, 1)]


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)], ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("shape", WGMMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_gemm(dt, trans, shape):
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], dtype_a=dt, dtype_b=dt,
                epilogue="bias+gelu")
    v = VARIANTS["cuda.gemm.wgmma"]
    for config in v.hero_configs(op, profile):
        t = T.gemm_inputs(op, seed=m + k)
        v.run(op, config, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= T.tolerance("f16" if dt == "float16" else "bf16", op.out_dtype), (config.key, err)


# Rows TMA cannot address (K, N or M not a multiple of 8 16-bit elements): pitched scratch copies.
PITCHED_SHAPES = [(1, 1, 1, 1), (7, 13, 5, 1), (129, 4095, 1023, 2), (1030, 1021, 777, 1), (257, 12345, 4096, 1),
                  (300, 136, 131, 3)]


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)], ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("shape", PITCHED_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_gemm_pitched_copies(dt, trans, shape):
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], dtype_a=dt, dtype_b=dt,
                epilogue="bias+gelu")
    v = VARIANTS["cuda.gemm.wgmma"]
    assert not v.check(op, profile), v.check(op, profile)
    configs = v.hero_configs(op, profile)
    T.check_gemm_configs(v, op, configs[:3] + configs[-1:], T.tolerance("f16" if dt == "float16" else "bf16",
                                                                          op.out_dtype), seed=m + k)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("epilogue", ["gelu", "bias+gelu"])
@pytest.mark.parametrize("shape", [(264, 200, 136), (72, 1000, 520)], ids=lambda s: "x".join(map(str, s)))
def test_wgmma_gelu_pair_epilogue(dt, epilogue, shape):
    """The 16-bit GELU(tanh) chain runs per column pair with the bias pre-halved in shared memory and
    loaded ahead of the mainloop: every hero and tile_n 64/128/256, odd edges, NaN-poisoned outputs."""
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    m, n, k = shape
    op = GemmOp(m, n, k, dtype_a=dt, dtype_b=dt, epilogue=epilogue)
    v = VARIANTS["cuda.gemm.wgmma"]
    from tracea_cuda.variants.hopper import _hero

    configs = v.hero_configs(op, profile) + [_hero(64, 8, cluster=1), _hero(128, 4, bm=256, cluster=1)]
    for config in configs:
        t = T.gemm_inputs(op, seed=m + len(epilogue))
        t["out"].fill_(float("nan"))
        v.run(op, config, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= T.tolerance("f16" if dt == "float16" else "bf16", op.out_dtype), (config.key, err)


DEFER_SHAPES = [(8, 8, 8, 1), (136, 264, 72, 1), (1000, 1016, 520, 2), (264, 136, 2000, 1), (4096, 2048, 1024, 1)]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("epilogue", ["none", "gelu", "bias+gelu", "bias+relu", "bias+silu", "bias+gelu_erf"])
@pytest.mark.parametrize("shape", DEFER_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_deferred_epilogue(dt, epilogue, shape):
    """16-bit output with the activation and stores of each tile deferred into the next tile's mainloop:
    single tiles, odd edges (scalar tail stores), batches, short and long K (chunks finished after the
    mainloop or under it), tile_n 64/128/256, 2-CTA clusters; NaN-poisoned outputs."""
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    from tracea_cuda.variants.hopper import _hero

    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, dtype_a=dt, dtype_b=dt, epilogue=epilogue)
    configs = [_hero(256, 3, 16, cluster=1, defer=True), _hero(128, 3, bm=256, cluster=1, defer=True),
               _hero(256, 3, cluster=2, defer=True), _hero(64, 4, cluster=1, defer=True),
               _hero(128, 4, cluster=1, defer=True)]
    tol = T.tolerance("bf16" if dt == "bfloat16" else "f16", op.out_dtype)
    T.check_gemm_configs(VARIANTS["cuda.gemm.wgmma"], op, configs, tol, seed=m + n + len(epilogue))


@pytest.mark.parametrize("epilogue", ["bias+gelu", "bias+silu", "bias+gelu_erf"])
def test_wgmma_deferred_epilogue_fp16_overflow(epilogue):
    """float16 stash: a pre-activation beyond -65504 becomes -inf there; GELU/SiLU of it must still give
    0 (not NaN), and one beyond +65504 gives inf like the non-deferred kernel and eager PyTorch."""
    import torch

    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    from tracea_cuda.variants.hopper import _hero

    op = GemmOp(256, 512, 64, dtype_a="float16", dtype_b="float16", epilogue=epilogue)
    v = VARIANTS["cuda.gemm.wgmma"]
    t = T.gemm_inputs(op, seed=5)
    t["a"].fill_(4.0)  # every row of A is 4, so column j of A @ B is 4 * sum_k B[k, j]
    t["b"][..., :128] = -4.0
    t["b"][..., 128:256] = 4.0
    t["b"][..., 256:] *= 0.25
    t["bias"][:128] = -65504.0  # pre-activation -66528: below float16's range
    t["bias"][128:256] = 65504.0  # +66528: above it
    outs = {}
    for defer in (False, True):
        t["out"].fill_(float("nan"))
        v.run(op, _hero(256, 3, 16, cluster=1, defer=defer), T.op_args(t), profile)
        outs[defer] = t["out"].clone()
    got, want = outs[True].float(), outs[False].float()
    assert not torch.isnan(got).any()
    assert (got[..., :128] == 0).all() and torch.isinf(got[..., 128:256]).all()
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("epilogue", ["none", "relu", "bias+gelu_erf", "bias+silu"])
def test_wgmma_epilogues_and_cast(epilogue):
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    op = GemmOp(392, 520, 264, dtype_a="bfloat16", dtype_b="bfloat16", dtype_out="float32", epilogue=epilogue)
    v = VARIANTS["cuda.gemm.wgmma"]
    t = T.gemm_inputs(op)
    v.run(op, v.hero_configs(op, profile)[0], T.op_args(t), profile)
    assert T.rel_err(t["out"], T.gemm_reference(op, t)) <= 1e-4


@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)], ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("shape", [(4, 4, 4, 1), (132, 260, 68, 2), (1000, 1020, 516, 1), (2048, 2048, 2048, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_wgmma_tf32_gemm(trans, shape):
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], fp32_precision="high", epilogue="bias+relu")
    v = VARIANTS["cuda.gemm.wgmma_tf32"]
    for config in v.hero_configs(op, profile):
        t = T.gemm_inputs(op, seed=n)
        v.run(op, config, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= T.tolerance("tf32", op.out_dtype), (config.key, err)


@pytest.mark.parametrize("trans", [(False, False), (True, True), (True, False)], ids=["NN", "TT", "TN"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("epilogue", ["none", "bias+gelu_erf", "bias+silu"])
def test_wgmma_tf32_register_fed_operand(trans, out, epilogue):
    """MN-major TF32 operands go through registers (NN: operands swapped, C^T stored column-major);
    every non-power-of-two edge, batches, each output cast and epilogue, NaN-poisoned outputs."""
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    op = GemmOp(196, 324, 100, batch=2, trans_a=trans[0], trans_b=trans[1], fp32_precision="high",
                dtype_out=out, epilogue=epilogue)
    v = VARIANTS["cuda.gemm.wgmma_tf32"]
    t = T.gemm_inputs(op, seed=len(epilogue))
    ref = T.gemm_reference(op, t)
    for config in v.hero_configs(op, profile) + [_pingpong(op, v, profile)]:
        t["out"].fill_(float("nan"))
        v.run(op, config, T.op_args(t), profile)
        err = T.rel_err(t["out"], ref)
        assert err <= T.tolerance("tf32", op.out_dtype), (config.key, err)


def _pingpong(op, v, profile):
    from tracea_cuda.variants.hopper import _hero

    config = _hero(128, 6, schedule="pingpong", smem_epilogue=False, cluster=1)
    assert v.validate_config(op, config, profile), config.key
    return config


@pytest.mark.parametrize("trans", [(False, False), (True, True)], ids=["NN", "TT"])
@pytest.mark.parametrize("shape", [(4, 8, 4, 1), (132, 260, 68, 2), (1000, 1020, 4096, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_wgmma_3xtf32_is_fp32_accurate(trans, shape):
    profile = T.gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], fp32_precision="highest", epilogue="bias")
    v = VARIANTS["cuda.gemm.wgmma_3xtf32"]
    for config in v.hero_configs(op, profile):
        t = T.gemm_inputs(op, seed=k)
        v.run(op, config, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= 1e-5, (config.key, err)
