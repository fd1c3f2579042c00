"""The widened-bf16 skinny variants (``cpu.gemv.bf16cvt.<isa>``: bf16 widened to fp32 in registers on
AVX2 / plain AVX-512): float64 references from the bf16 inputs, NaN-poisoned outputs, odd N and K (vector
body, tails), every row count 1-16, epilogues, batches, one to three threads, bf16 output bit-equal to
torch's rounding of the fp32 output (ties to even, overflow, NaN), NaN/Inf propagation, what the variants
decline, the Doctor's choice, and the user path (``tracea.ops.matmul``, ``tracea_torch.ops.linear``,
patched ``nn.Linear``)."""

from __future__ import annotations

import pytest

from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.skinny import BF16CVT_MAX_M, CpuSkinnyBf16CvtVariant
from tracea_cpu.testing import AMX_PROFILE, HAVE_CC, PROFILE, config, epilogue_ref

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not HAVE_CC, reason="no C compiler"), pytest.mark.torch]

ODD = [1, 7, 16, 17, 33, 1000, 1408]
EPILOGUES = ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"]
ISAS = [pytest.param(name, marks=pytest.mark.skipif(not PROFILE.has(*ISA_BY_NAME[name].requires),
                                                    reason=f"this CPU lacks {name}"))
        for name in ("avx512", "avx2")]


def _op(m, n, k, *, batch=1, epi="none", out="bf16"):
    return GemmOp(m, n, k, batch=batch, trans_b=True, epilogue=epi, dtype_a="bf16", dtype_b="bf16", dtype_out=out)


def _run(isa, op, a, b, bias, threads=2):
    """The variant's output (NaN-poisoned first) for bf16 ``a`` (batch, m, k), ``b`` (batch, n, k)."""
    from tracea_torch.adapter import TorchAdapter

    odt = torch.bfloat16 if op.out_dtype is DType.BF16 else torch.float32
    res = torch.full((op.batch, op.m, op.n), float("nan"), dtype=odt)
    CpuSkinnyBf16CvtVariant(ISA_BY_NAME[isa]).run(op, config(threads=threads),
                                                  OpArgs({"a": a, "b": b, "bias": bias}, res, TorchAdapter()), PROFILE)
    return res


def same_rounding(r16, r32) -> bool:
    """Whether bf16 ``r16`` is torch's rounding of fp32 ``r32``: NaN where it is NaN (torch's own NaN bits
    differ between its scalar and vector conversions), every other value bit for bit."""
    nan = torch.isnan(r32)
    t16 = r32.bfloat16()
    return torch.equal(torch.isnan(r16), nan) and torch.equal(r16.view(torch.int16)[~nan], t16.view(torch.int16)[~nan])


def case(isa, m, n, k, *, batch=1, epi="none", threads=2, seed=0):
    """fp32-output relative error against float64, after checking that the bf16 output of the same call
    is torch's round-to-nearest-even of the fp32 one, bit for bit (both come from the same fp32 sums)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, m, k, generator=g).bfloat16()
    b = torch.randn(batch, n, k, generator=g).bfloat16()
    op32, op16 = _op(m, n, k, batch=batch, epi=epi, out="float32"), _op(m, n, k, batch=batch, epi=epi)
    bias16 = torch.randn(n, generator=g).bfloat16() if op32.epilogue.has_bias else None
    bias32 = None if bias16 is None else bias16.float()  # the same values in either output dtype
    r32 = _run(isa, op32, a, b, bias32, threads)
    r16 = _run(isa, op16, a, b, bias16, threads)
    assert not torch.isnan(r32).any()
    assert same_rounding(r16, r32), (m, n, k, epi)
    ref = epilogue_ref(a.double().numpy() @ b.double().numpy().transpose(0, 2, 1), op32.epilogue.steps,
                       None if bias16 is None else bias16.double().numpy(), axis=2)
    return float(((r32.double().numpy() - ref) ** 2).sum() ** 0.5 / ((ref ** 2).sum() ** 0.5))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 16])
def test_odd_shapes_every_row_count(isa, m):
    for n in ODD:
        for k in ODD:
            if m > 4 and n * k > 600_000:
                continue
            assert case(isa, m, n, k, seed=n * k + m) < 1e-5, (isa, m, n, k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("epi", EPILOGUES)
def test_epilogues_batches_threads(isa, epi):
    for m, n, k, bt, th in [(1, 1000, 129, 1, 2), (3, 33, 1000, 2, 1), (4, 17, 33, 3, 3), (2, 1408, 512, 1, 2),
                            (16, 40, 77, 2, 2), (7, 1, 5, 1, 1)]:
        assert case(isa, m, n, k, epi=epi, batch=bt, threads=th, seed=m + n) < 1e-5, (isa, epi, m, n, k)


@pytest.mark.parametrize("isa", ISAS)
def test_rounding_ties_overflow_and_nan(isa):
    # K = 2, W = [1, 1]: each output is a0 + a1, exact in fp32. 1 + 2^-8 lies halfway between the bf16
    # values 1 and 1 + 2^-7 (to even: 1); 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (to even:
    # 1 + 2^-6); the largest bf16 plus half its step rounds to +inf; NaN stays NaN.
    big = float(torch.finfo(torch.bfloat16).max)
    rows = [[1.0, 2 ** -8], [1.0, 3 * 2 ** -8], [-1.0, -(2 ** -8)], [big, big * 2 ** -8], [float("nan"), 1.0],
            [float("inf"), 1.0], [float("inf"), float("-inf")], [2 ** -130, 0.0]]
    m = len(rows)
    a = torch.tensor(rows).bfloat16().reshape(1, m, 2)
    n = 21  # a vector of outputs and a tail
    b = torch.ones(1, n, 2).bfloat16()
    out = _run(isa, _op(m, n, 2), a, b, None)[0, :, 0]
    expect = [1.0, 1 + 2 ** -6, -1.0, float("inf"), float("nan"), float("inf"), float("nan"), 2 ** -130]
    for got, want in zip(out.float().tolist(), expect):
        assert (got != got and want != want) or got == want, (out, expect)
    r32 = _run(isa, _op(m, n, 2, out="float32"), a, b, None)
    assert same_rounding(_run(isa, _op(m, n, 2), a, b, None), r32)


@pytest.mark.parametrize("isa", ISAS)
def test_nan_and_inf_propagate(isa):
    g = torch.Generator().manual_seed(5)
    m, n, k = 3, 40, 101
    a = torch.randn(1, m, k, generator=g).bfloat16()
    b = torch.randn(1, n, k, generator=g).bfloat16()
    a[0, 0, 5] = float("nan")  # row 0: NaN everywhere
    b[0, 7, 100] = float("inf")  # column 7: +-inf in rows 1 and 2, from the k tail
    b[0, 9, 3] = float("-inf")  # column 9: from the vector body
    ref = a.double() @ b.double().transpose(1, 2)
    for out in ("float32", "bf16"):
        res = _run(isa, _op(m, n, k, out=out), a, b, None).double()
        assert torch.equal(torch.isnan(res), torch.isnan(ref)) and torch.equal(torch.isinf(res), torch.isinf(ref))
        assert torch.equal(torch.sign(res[torch.isinf(ref)]), torch.sign(ref[torch.isinf(ref)]))
        assert torch.isnan(res[0, 0]).all() and torch.isinf(res[0, 1, 7]) and torch.isinf(res[0, 2, 9])
        fin = torch.isfinite(ref)
        tol = 1e-5 if out == "float32" else 1e-2
        assert float((res[fin] - ref[fin]).norm() / ref[fin].norm()) < tol


def test_declines_with_reasons():
    v = CpuSkinnyBf16CvtVariant(ISA_BY_NAME["avx2"])
    ok = _op(BF16CVT_MAX_M, 512, 512)
    if PROFILE.has("avx2", "fma") and not PROFILE.has("avx512_bf16"):
        assert v.check(ok, PROFILE) == []
        assert v.check(_op(1, 8, 8, out="float32"), PROFILE) == []
    assert any(f"at most {BF16CVT_MAX_M}" in r for r in v.check(_op(BF16CVT_MAX_M + 1, 512, 512), PROFILE))
    assert any("K x N" in r for r in v.check(GemmOp(1, 512, 512, dtype_a="bf16", dtype_b="bf16",
                                                    dtype_out="bf16"), PROFILE))
    assert any("dtype" in r for r in v.check(GemmOp(1, 8, 8, trans_b=True), PROFILE))  # fp32: cpu.gemv.<isa>
    # hosts with avx512_bf16 run vdpbf16ps (cpu.gemv.avx512bf16) and AMX: these variants step aside there
    for isa in ("avx2", "avx512"):
        reasons = CpuSkinnyBf16CvtVariant(ISA_BY_NAME[isa]).check(ok, AMX_PROFILE)
        assert any("avx512_bf16" in r for r in reasons), reasons


def test_ranks_below_the_native_bf16_variants():
    from tracea_cpu.skinny import CpuSkinnyBf16Variant
    from tracea_cpu.variants import all_variants

    cvt = [CpuSkinnyBf16CvtVariant(ISA_BY_NAME[i]) for i in ("avx2", "avx512")]
    assert all(v.priority < CpuSkinnyBf16Variant().priority for v in cvt)
    assert cvt[1].priority > cvt[0].priority  # the wider ISA first where both run
    names = [v.name for v in all_variants()]
    assert "cpu.gemv.bf16cvt.avx2" in names and "cpu.gemv.bf16cvt.avx512" in names


@pytest.mark.skipif(not PROFILE.has("avx2", "fma") or PROFILE.has("avx512_bf16"),
                    reason="needs a CPU with AVX2 and FMA but no avx512_bf16")
def test_doctor_picks_it_for_bf16_decode():
    from tracea.doctor.doctor import get_doctor

    doc = get_doctor()
    for m, n, k, out in [(1, 4096, 4096, "bf16"), (4, 11008, 4096, "bf16"), (16, 512, 512, "float32"), (1, 3, 17, "bf16")]:
        chosen = doc.decide(_op(m, n, k, out=out), "cpu").chosen.variant.name
        assert chosen.startswith("cpu.gemv.bf16cvt."), (m, n, k, chosen)
    assert not doc.decide(_op(BF16CVT_MAX_M + 1, 512, 512), "cpu").chosen.variant.name.startswith("cpu.gemv.")


@pytest.mark.skipif(not PROFILE.has("avx2", "fma") or PROFILE.has("avx512_bf16"),
                    reason="needs a CPU with AVX2 and FMA but no avx512_bf16")
def test_user_path_torch_bf16(tmp_path, monkeypatch):
    from tracea import ops
    from tracea.runtime import fallbacks
    from tracea_cpu import skinny

    tracea_torch = pytest.importorskip("tracea_torch")
    from tracea_torch.ops import linear

    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEA_ARBITER", "0")  # Tracea serves: the result is what is checked
    calls = []
    real = skinny.CpuSkinnyBf16CvtVariant.entry

    def counted(self, op):
        calls.append(self.name)
        return real(self, op)

    monkeypatch.setattr(skinny.CpuSkinnyBf16CvtVariant, "entry", counted)
    fallbacks.reset()
    g = torch.Generator().manual_seed(3)
    for m, n, k in [(2, 1408, 1000), (9, 17, 33)]:
        x = torch.randn(m, k, generator=g).bfloat16()
        w = torch.randn(n, k, generator=g).bfloat16()
        bias = torch.randn(n, generator=g).bfloat16()
        ref = x.double() @ w.double().T + bias.double()
        for out in (ops.matmul(x, w.T, bias=bias, activation="gelu"), linear(x, w, bias, activation="gelu"),
                    linear(x.unsqueeze(0), w, bias, activation="gelu")[0]):
            assert out.dtype == torch.bfloat16
            r = torch.nn.functional.gelu(ref)
            assert float((out.double() - r).norm() / r.norm()) < 1e-2, (m, n, k)
        lin = torch.nn.Linear(k, n).bfloat16()
        tracea_torch.patch_linear(lin)
        try:
            with torch.no_grad():
                out = lin(x.unsqueeze(0))
                r = x.double() @ lin.weight.double().T + lin.bias.double()
            assert float((out[0].double() - r).norm() / r.norm()) < 1e-2
        finally:
            tracea_torch.unpatch_linear(lin)
    assert calls and all(c.startswith("cpu.gemv.bf16cvt.") for c in calls), calls
    assert not fallbacks.counts(), fallbacks.counts()
