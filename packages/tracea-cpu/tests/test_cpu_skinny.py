"""The skinny GEMM variants (``cpu.gemv.<isa>``, ``cpu.gemv.avx512bf16``): x @ W.T for 1-16 rows against
weights stored N x K. float64 references on fresh random inputs, NaN-poisoned outputs, odd N and K, every
row count, every epilogue, batches, one to three threads, NaN/Inf propagation, what the variants decline,
the Doctor's choice, the thread rule, and the user path (``tracea.ops.matmul``, patched ``nn.Linear``)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import GemmOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.skinny import (BF16_MAX_M, COLD_THREADS_BYTES, CpuSkinnyBf16Variant, CpuSkinnyVariant,
                               auto_threads, workers_spin)
from tracea_cpu.testing import BEST, HAVE_CC, ISAS, PROFILE, config, epilogue_ref, gemm_error, rand, rel_err

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

ODD = [1, 3, 17, 1000, 1408]
EPILOGUES = ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"]
HAVE_BF16 = PROFILE.has("avx512_bf16")


def f32_case(isa: str, m: int, n: int, k: int, *, batch=1, epi="none", threads=2, seed=0) -> float:
    """Relative error (fp32 summation bound for a handful of outputs: tracea_cpu.testing.gemm_error)."""
    op = GemmOp(m, n, k, batch=batch, trans_b=True, epilogue=epi)
    return gemm_error(CpuSkinnyVariant(ISA_BY_NAME[isa]), op, config(threads=threads), seed)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 13, 16])
def test_f32_odd_shapes_every_row_count(isa, m):
    for n in ODD:
        for k in ODD:
            if isa == "scalar" and n * k > 200_000:
                continue
            if m > 4 and n * k > 600_000 and isa != BEST:
                continue
            assert f32_case(isa, m, n, k, seed=n + k + m) < 1e-5, (isa, m, n, k)


@pytest.mark.parametrize("epi", EPILOGUES)
def test_f32_every_epilogue(epi):
    for m, n, k in [(1, 1000, 129), (3, 33, 1000), (16, 17, 17), (2, 1408, 33), (5, 7, 512)]:
        assert f32_case(BEST, m, n, k, epi=epi, seed=m * n) < 1e-5, (epi, m, n, k)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_f32_batched_and_thread_counts(threads):
    for m, n, k in [(3, 129, 33), (16, 1000, 64), (1, 40, 1000), (4, 16, 5)]:
        assert f32_case(BEST, m, n, k, batch=3, epi="bias", threads=threads) < 1e-5, (m, n, k)


def test_f32_nan_and_inf_propagate():
    v = CpuSkinnyVariant(ISA_BY_NAME[BEST])
    op = GemmOp(3, 40, 100, trans_b=True, epilogue="bias+relu")
    rng = np.random.default_rng(1)
    a, b, bias = rand(rng, 1, 3, 100), rand(rng, 1, 40, 100), rand(rng, 40)
    a[0, 0, 5] = np.nan  # row 0: NaN everywhere, relu included
    b[0, 7, 99] = np.inf  # column 7: +-inf (or NaN) in rows 1 and 2, from the k tail
    out = np.full((1, 3, 40), np.nan, np.float32)
    v.run(op, config(threads=2), OpArgs({"a": a, "b": b, "bias": bias}, out, _numpy()), PROFILE)
    ref = epilogue_ref(a.astype(np.float64) @ b.astype(np.float64).transpose(0, 2, 1), ["bias", "relu"], bias, 2)
    assert np.isnan(out[0, 0]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    fin = np.isfinite(ref)
    assert rel_err(out[fin], ref[fin]) < 1e-5


def _numpy():
    from tracea.runtime.arrays import NumpyAdapter

    return NumpyAdapter()


def test_declines_with_reasons():
    v = CpuSkinnyVariant(ISA_BY_NAME[BEST])
    assert v.check(GemmOp(16, 512, 512, trans_b=True), PROFILE) == []
    assert any("at most 16" in r for r in v.check(GemmOp(17, 512, 512, trans_b=True), PROFILE))
    assert any("K x N" in r for r in v.check(GemmOp(1, 512, 512), PROFILE))
    assert any("a transposed" in r for r in v.check(GemmOp(2, 512, 512, trans_a=True, trans_b=True), PROFILE))
    assert any("dtype" in r for r in v.check(GemmOp(1, 8, 8, trans_b=True, dtype_a="bf16", dtype_b="bf16",
                                                    dtype_out="bf16"), PROFILE))


def test_doctor_picks_skinny_for_decode_shapes(monkeypatch):
    from tracea.doctor.doctor import get_doctor

    doc = get_doctor()
    for m, n, k in [(1, 512, 512), (1, 1408, 512), (4, 512, 1408), (1, 3, 17)]:
        d = doc.decide(GemmOp(m, n, k, trans_b=True), "cpu")
        # (which ISA is the measured data's call: the bandwidth-bound GEMV runs avx2 and avx512 within noise)
        assert d.chosen.variant.name.startswith("cpu.gemv."), (m, n, k, d.chosen.variant.name)
    # at 16 rows the blocked GEMM measured as fast or faster here (perf data, 2026-11-26: 16x4608x3584 3.7 vs
    # 4.1 ms): the skinny variant is a candidate the data ranks, not a rule
    d = doc.decide(GemmOp(16, 4096, 4096, trans_b=True), "cpu")
    assert any(c.variant.name.startswith("cpu.gemv.") for c in d.candidates), d.explain()
    for op in (GemmOp(17, 512, 512, trans_b=True), GemmOp(1, 512, 512)):
        assert not doc.decide(op, "cpu").chosen.variant.name.startswith("cpu.gemv."), op.describe()


def test_thread_rule():
    assert auto_threads(4 * 512 * 512, 2, spinning=True) == 2
    assert auto_threads(4 * 64 * 64, 2, spinning=True) == 1  # 16 KiB: one thread
    assert auto_threads(4 * 512 * 512, 8, spinning=True) == 8
    assert auto_threads(4 * 512 * 512, 2, spinning=False) == 1  # a sleeping worker costs more than it gives
    assert auto_threads(COLD_THREADS_BYTES, 2, spinning=False) == 2
    assert auto_threads(1 << 30, 1, spinning=True) == 1
    assert workers_spin({}) and workers_spin({"GOMP_SPINCOUNT": "infinite"}) and workers_spin({"GOMP_SPINCOUNT": "300k"})
    assert not workers_spin({"GOMP_SPINCOUNT": "1000"}) and not workers_spin({"OMP_WAIT_POLICY": "passive"})
    assert workers_spin({"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": "active"})
    assert workers_spin({"GOMP_SPINCOUNT": "junk"})


def test_thread_count_config_and_environment(monkeypatch):
    v = CpuSkinnyVariant(ISA_BY_NAME[BEST])
    op = GemmOp(1, 1024, 1024, trans_b=True)
    assert v.threads(op, config(threads=1), PROFILE) == 1
    monkeypatch.setenv("TRACEA_NUM_THREADS", "1")
    assert v.threads(op, config(threads=0), PROFILE) == 1
    assert not v.validate_config(op, config(threads=-1), PROFILE)


def test_user_path_numpy_matmul_transposed_weights(tmp_path, monkeypatch):
    from tracea import ops

    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(7)
    for m, n, k in [(1, 1408, 512), (7, 17, 1000), (16, 3, 3)]:
        x, w, bias = rand(rng, m, k), rand(rng, n, k), rand(rng, n)
        out = ops.matmul(x, w.T, bias=bias, activation="silu")
        ref = epilogue_ref(x.astype(np.float64) @ w.astype(np.float64).T, ["bias", "silu"], bias, axis=1)
        assert rel_err(out, ref) < 1e-5, (m, n, k)
        # a non-contiguous x (every other row of a larger array) is packed by the runtime first
        xs = rand(rng, 2 * m, k)[::2]
        out = ops.matmul(xs, w.T)
        assert rel_err(out, xs.astype(np.float64) @ w.astype(np.float64).T) < 1e-5


# ------------------------------------------------------------------------------------------------
# bf16
# ------------------------------------------------------------------------------------------------

bf16_only = pytest.mark.skipif(not HAVE_BF16, reason="this CPU lacks avx512_bf16")


def bf16_case(m, n, k, *, batch=1, epi="none", out="bf16", threads=2, seed=0):
    torch = pytest.importorskip("torch")
    from tracea_torch.adapter import TorchAdapter

    g = torch.Generator().manual_seed(seed)
    op = GemmOp(m, n, k, batch=batch, trans_b=True, epilogue=epi, dtype_a="bf16", dtype_b="bf16", dtype_out=out)
    a = torch.randn(batch, m, k, generator=g).bfloat16()
    b = torch.randn(batch, n, k, generator=g).bfloat16()
    odt = torch.bfloat16 if out == "bf16" else torch.float32
    bias = torch.randn(n, generator=g).to(odt) if op.epilogue.has_bias else None
    res = torch.full((batch, m, n), float("nan"), dtype=odt)
    CpuSkinnyBf16Variant().run(op, config(threads=threads), OpArgs({"a": a, "b": b, "bias": bias}, res,
                                                                   TorchAdapter()), PROFILE)
    assert not torch.isnan(res).any()
    ref = epilogue_ref(a.double().numpy() @ b.double().numpy().transpose(0, 2, 1), op.epilogue.steps,
                       None if bias is None else bias.double().numpy(), axis=2)
    return rel_err(res.float().numpy(), ref)


@bf16_only
@pytest.mark.torch
@pytest.mark.parametrize("m", list(range(1, BF16_MAX_M + 1)))
@pytest.mark.parametrize("out,tol", [("float32", 1e-5), ("bf16", 1e-2)])
def test_bf16_odd_shapes(m, out, tol):
    for n in ODD:
        for k in ODD:
            assert bf16_case(m, n, k, out=out, seed=n * k + m) < tol, (m, n, k)


@bf16_only
@pytest.mark.torch
@pytest.mark.parametrize("epi", EPILOGUES)
def test_bf16_epilogues_batches_threads(epi):
    for m, n, k, bt, th in [(1, 1000, 129, 1, 2), (3, 33, 1000, 2, 1), (4, 17, 33, 3, 3), (2, 1408, 512, 1, 2)]:
        assert bf16_case(m, n, k, epi=epi, batch=bt, threads=th, out="float32") < 1e-5, (epi, m, n, k)
        assert bf16_case(m, n, k, epi=epi, batch=bt, threads=th, out="bf16") < 1e-2, (epi, m, n, k)


@bf16_only
@pytest.mark.torch
def test_bf16_user_path_and_doctor(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from tracea import ops
    from tracea.doctor.doctor import get_doctor

    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    d = get_doctor().decide(GemmOp(1, 4096, 4096, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16"),
                            "cpu")
    assert d.chosen.variant.name == "cpu.gemv.avx512bf16"
    many = GemmOp(BF16_MAX_M + 1, 4096, 4096, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
    assert get_doctor().decide(many, "cpu").chosen.variant.name != "cpu.gemv.avx512bf16"
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 1000, generator=g).bfloat16()
    w = torch.randn(1408, 1000, generator=g).bfloat16()
    bias = torch.randn(1408, generator=g).bfloat16()
    out = ops.matmul(x, w.T, bias=bias, activation="gelu")
    assert out.dtype == torch.bfloat16
    ref = torch.nn.functional.gelu(x.double() @ w.double().T + bias.double())
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.torch
def test_patched_linear_decode_matches_float64(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    tracea_torch = pytest.importorskip("tracea_torch")

    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEA_ARBITER", "0")  # Tracea serves: the result is what is checked
    torch.manual_seed(0)
    dtypes = [torch.float32] + ([torch.bfloat16] if HAVE_BF16 else [])
    for dt in dtypes:
        for m, n, k, bias in [(1, 1408, 512, False), (3, 17, 1000, True), (1, 1, 3, True)]:
            lin = torch.nn.Linear(k, n, bias=bias).to(dt)
            tracea_torch.patch_linear(lin)
            x = torch.randn(1, m, k).to(dt)
            with torch.no_grad():
                out = lin(x)
                ref = x.double() @ lin.weight.double().T + (lin.bias.double() if bias else 0)
            tol = 1e-5 if dt is torch.float32 else 1e-2
            assert float((out.double() - ref).norm() / ref.norm()) < tol, (dt, m, n, k)


@bf16_only
@pytest.mark.torch
def test_bf16_nan_and_inf_propagate():
    torch = pytest.importorskip("torch")
    from tracea_torch.adapter import TorchAdapter

    g = torch.Generator().manual_seed(5)
    op = GemmOp(2, 40, 100, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="float32")
    a = torch.randn(1, 2, 100, generator=g).bfloat16()
    b = torch.randn(1, 40, 100, generator=g).bfloat16()
    a[0, 0, 5] = float("nan")  # row 0: NaN everywhere
    b[0, 7, 99] = float("inf")  # column 7 of row 1: +-inf, from the masked k tail
    out = torch.full((1, 2, 40), float("nan"))
    CpuSkinnyBf16Variant().run(op, config(threads=2), OpArgs({"a": a, "b": b, "bias": None}, out, TorchAdapter()),
                               PROFILE)
    ref = a.double() @ b.double().transpose(1, 2)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
    assert torch.isnan(out[0, 0]).all() and torch.isinf(out[0, 1, 7])
    fin = torch.isfinite(ref)
    assert float((out[fin].double() - ref[fin]).norm() / ref[fin].norm()) < 1e-5


def test_non_contiguous_operands_are_refused_with_layout_error():
    from tracea.errors import LayoutError

    v = CpuSkinnyVariant(ISA_BY_NAME[BEST])
    op = GemmOp(2, 16, 32, trans_b=True)
    rng = np.random.default_rng(2)
    a = rand(rng, 1, 2, 64)[:, :, ::2]  # every other column: not packed
    b, out = rand(rng, 1, 16, 32), np.full((1, 2, 16), np.nan, np.float32)
    with pytest.raises(LayoutError):
        v.run(op, config(threads=1), OpArgs({"a": a, "b": b, "bias": None}, out, _numpy()), PROFILE)
    assert np.isnan(out).all()  # nothing written
