"""fp16 GEMM (``cpu.gemm.f16.avx512`` / ``cpu.gemm.f16.avx2`` / ``cpu.gemm.f16amx``) against a float64 reference of the fp16
inputs: odd and tiny shapes, transposes, batches, every epilogue, both output dtypes, small cache blocks
(several K blocks), NaN / Inf placement, the fp32 accuracy class (an fp16-accumulating kernel fails
it), NumPy and torch operands, bad operands, and the user path. Each ISA's tests skip, with the reason,
where the CPU lacks it or F16C."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.errors import TraceaError
from tracea.ir.ops import GemmOp
from tracea.runtime.arrays import NumpyAdapter
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.f16 import CpuGemmF16Variant
from tracea_cpu.isa import AVX2, AVX512
from tracea_cpu.testing import HAVE_CC, PROFILE, config, epilogue_ref, rel_err

SHAPES = [(1, 1, 1), (1, 33, 129), (7, 7, 7), (33, 1, 7), (17, 33, 65), (97, 131, 257), (2, 97, 3), (64, 64, 64),
          (31, 47, 95), (130, 17, 300)]


def _variants():
    out = []
    for isa in (AVX512, AVX2):
        ok = HAVE_CC and isa.runs_here() and PROFILE.has(*isa.requires, "f16c")
        out.append(pytest.param(CpuGemmF16Variant(isa), id=isa.name,
                                marks=pytest.mark.skipif(not ok, reason=f"needs a C compiler, {isa.name} and F16C")))
    from tracea_cpu.amx import amx_permission
    from tracea_cpu.f16_amx import CpuGemmF16AmxVariant

    amx = HAVE_CC and PROFILE.has("amx_tile", "amx_bf16", "f16c")
    why = "" if not amx else (amx_permission() or "")
    out.append(pytest.param(CpuGemmF16AmxVariant(), id="amx",
                            marks=pytest.mark.skipif(not amx or bool(why),
                                                     reason=why or "needs a C compiler, AMX-BF16 and F16C")))
    return out


VARIANTS = _variants()


def case(v, m, n, k, *, batch=1, ta=False, tb=False, epi="none", out="float32", cfg=None, seed=0, nonfinite=0,
         bias_dtype=np.float32):
    rng = np.random.default_rng(seed)
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, epilogue=epi, dtype_a="f16", dtype_b="f16",
                dtype_out=out)
    a = rng.standard_normal((batch, *((k, m) if ta else (m, k)))).astype(np.float16)
    b = rng.standard_normal((batch, *((n, k) if tb else (k, n)))).astype(np.float16)
    if nonfinite:
        inject_nonfinite(rng, a, nonfinite)
        inject_nonfinite(rng, b, 1)
    bias = rng.standard_normal(n).astype(bias_dtype) if op.epilogue.has_bias else None
    res = np.full((batch, m, n), np.nan, dtype=np.float16 if out == "f16" else np.float32)
    # one register tile per ISA (each tile and epilogue is a separate compile)
    cfg = cfg or v.hero_configs(GemmOp(64, 64, 64, dtype_a="f16", dtype_b="f16"), PROFILE)[0]
    v.run(op, cfg, OpArgs({"a": a, "b": b, "bias": bias}, res, NumpyAdapter()), PROFILE)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64 = a64.transpose(0, 2, 1) if ta else a64
    b64 = b64.transpose(0, 2, 1) if tb else b64
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(a64 @ b64, op.epilogue.steps, None if bias is None else bias.astype(np.float64), axis=2)
    return res.astype(np.float64), ref


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out", ["float32", "f16"])
def test_shapes(v, shape, out):
    got, ref = case(v, *shape, out=out, seed=sum(shape))
    # fp32 accumulation of exact fp16 products; an fp16 output adds one rounding (2^-11)
    assert rel_err(got, ref) < (3e-6 if out == "float32" else 1.5e-3)


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("ta,tb", [(False, True), (True, False), (True, True)])
def test_transposes_and_batches(v, ta, tb):
    got, ref = case(v, 37, 29, 71, batch=3, ta=ta, tb=tb, seed=4)
    assert rel_err(got, ref) < 3e-6


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("epi", ["bias+relu", "bias+gelu", "silu"])
def test_epilogues(v, epi):
    for out, bias_dtype in (("float32", np.float32), ("f16", np.float16)):
        got, ref = case(v, 45, 70, 33, epi=epi, out=out, bias_dtype=bias_dtype, seed=6)
        assert rel_err(got, ref) < (1e-5 if out == "float32" else 2e-3), (epi, out)


@pytest.mark.parametrize("v", VARIANTS)
def test_several_k_blocks_and_threads(v):
    for threads in (1, 2):
        mr, nr = v.isa.tiles[0]
        cfg = config(mr=mr, nr=nr, kc=64, mc=2 * mr, nc=2 * nr, threads=threads)  # AMX: 32 x 32 blocks
        got, ref = case(v, 150, 133, 1000, cfg=cfg, seed=8)
        assert rel_err(got, ref) < 3e-6


@pytest.mark.parametrize("v", VARIANTS)
def test_accumulates_in_fp32_not_fp16(v):
    """K = 4096 of values near 1: fp16 partial sums (or a lossy bf16 conversion) lose ~1e-3 relative;
    fp32 accumulation of exact products does not."""
    rng = np.random.default_rng(3)
    a = (1 + 0.01 * rng.standard_normal((1, 4, 4096))).astype(np.float16)
    b = (1 + 0.01 * rng.standard_normal((1, 4096, 8))).astype(np.float16)
    op = GemmOp(4, 8, 4096, dtype_a="f16", dtype_b="f16", dtype_out="float32")
    res = np.empty((1, 4, 8), np.float32)
    v.run(op, v.hero_configs(op, PROFILE)[0], OpArgs({"a": a, "b": b, "bias": None}, res, NumpyAdapter()), PROFILE)
    assert rel_err(res, a.astype(np.float64) @ b.astype(np.float64)) < 1e-6


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("seed", range(4))
def test_nan_inf_propagate(v, seed):
    got, ref = case(v, 19, 23, 37, seed=seed, nonfinite=2)
    why = nonfinite_mismatch(got, ref, atol=1e-5)
    assert why is None, why


@pytest.mark.parametrize("v", VARIANTS)
def test_bad_operands_are_rejected(v):
    op = GemmOp(4, 4, 4, dtype_a="f16", dtype_b="f16")
    a = np.ones((1, 4, 4), np.float16)
    cfg = v.hero_configs(op, PROFILE)[0]
    with pytest.raises(TraceaError):
        v.run(op, cfg, OpArgs({"a": a.astype(np.float32), "b": a, "bias": None}, np.empty((1, 4, 4), np.float32),
                              NumpyAdapter()), PROFILE)
    with pytest.raises(TraceaError):
        v.run(op, cfg, OpArgs({"a": np.ones((1, 8, 8), np.float16)[:, ::2, ::2], "b": a, "bias": None},
                              np.empty((1, 4, 4), np.float32), NumpyAdapter()), PROFILE)


def test_user_path_numpy_and_torch():
    import tracea
    from tracea.doctor.doctor import get_doctor

    if not (HAVE_CC and PROFILE.has("f16c") and (AVX512.runs_here() or AVX2.runs_here())):
        pytest.skip("needs a C compiler and an x86 CPU with F16C")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((70, 50)).astype(np.float16)
    b = rng.standard_normal((50, 90)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    y = tracea.ops.matmul(a, b)
    assert y.dtype == np.float16 and rel_err(y.astype(np.float64), ref) < 1.5e-3
    out = np.empty((70, 90), np.float16)
    out.flags.writeable = False
    with pytest.raises(TraceaError):
        tracea.ops.matmul(a, b, out=out)
    op = GemmOp(70, 90, 50, dtype_a="f16", dtype_b="f16", dtype_out="f16")
    assert get_doctor().decide(op, PROFILE.device, use_cache=False).chosen.variant.name.startswith("cpu.gemm.f16.")
    torch = pytest.importorskip("torch")
    from tracea.runtime import fallbacks

    before = dict(fallbacks.counts())
    yt = tracea.ops.matmul(torch.from_numpy(a), torch.from_numpy(b))
    assert dict(fallbacks.counts()) == before, "fell back to torch"
    assert yt.dtype is torch.float16 and rel_err(yt.double().numpy(), ref) < 1.5e-3


@pytest.mark.parametrize("v", VARIANTS)
def test_inf_against_values_exact_in_bf16(v):
    """An Inf against B values with no bf16 remainder (1.0, -2.0, 0.0) gives +-Inf / NaN as the reference
    (the AMX split must not multiply the Inf by a zero low part)."""
    a = np.array([[[np.inf, 1.0, 0.5], [2.0, -np.inf, 1.0], [1.0, 1.0, 1.0]]], np.float16)
    b = np.array([[[1.0, -2.0, 0.0, 1.5], [1.0, 1.0, 1.0, 1.0], [0.25, 3.0, 1.0, np.inf]]], np.float16)
    op = GemmOp(3, 4, 3, dtype_a="f16", dtype_b="f16", dtype_out="float32")
    res = np.empty((1, 3, 4), np.float32)
    v.run(op, v.hero_configs(GemmOp(64, 64, 64, dtype_a="f16", dtype_b="f16"), PROFILE)[0],
          OpArgs({"a": a, "b": b, "bias": None}, res, NumpyAdapter()), PROFILE)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ b.astype(np.float64)
    why = nonfinite_mismatch(res, ref, atol=1e-6)
    assert why is None, why


def test_declines_decode_rows():
    """Fewer than MIN_ROWS rows: widening the whole weight costs more than the GEMM (PyTorch serves them)."""
    from tracea_cpu.f16 import MIN_ROWS

    v = CpuGemmF16Variant(AVX2)
    few = GemmOp(MIN_ROWS - 1, 4096, 4096, trans_b=True, dtype_a="f16", dtype_b="f16")
    assert any("rows" in r for r in v.check(few, PROFILE))
    assert not any("rows" in r for r in v.check(GemmOp(MIN_ROWS, 64, 64, dtype_a="f16", dtype_b="f16"), PROFILE))
