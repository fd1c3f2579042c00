"""``cuda.gemm.wgmma_fewrows_tf32`` (float32 ``x @ W.T`` of 17-127 rows with TF32 allowed, computed as C^T = W x^T on
TF32 wgmma): what it serves and declines, the routing that makes the tiled TF32 GEMMs give way at 17-64 rows, then
GPU runs against a float64 reference (TF32 tolerance) over odd shapes, epilogues and output dtypes, NaN / Inf, the
user path's default decision, bound calls and CUDA-graph replay."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.hopper_fewrows import TF32_ROUTED_ROWS, WgmmaFewRowsTf32, fewrows_tf32_serves

H100 = T.fake_profile("H100")
V = WgmmaFewRowsTf32()
BY_NAME = {v.name: v for v in all_variants()}


@pytest.fixture
def usable(monkeypatch):
    """CuPy reported usable, so ``check`` shows the variant's own reasons on a machine without it."""
    from tracea_cuda import toolkit

    monkeypatch.setattr(toolkit, "status", lambda: (True, ""))


def _op(m: int, n: int, k: int, precision: str = "high", **kw) -> GemmOp:
    return GemmOp(m, n, k, trans_b=True, dtype_a="float32", dtype_b="float32", fp32_precision=precision, **kw)


@pytest.mark.parametrize("op,why", [
    (_op(16, 4096, 4096), "skinny"),
    (GemmOp(32, 4096, 4096, dtype_a="float32", dtype_b="float32", fp32_precision="high"), "K-major"),
    (_op(32, 4096, 4100), "multiple of 8"),
])
def test_declines_with_a_reason(op, why, usable):
    reasons = V.check(op, H100)
    assert reasons and any(why in r for r in reasons), reasons


def test_requirements_precision_rows_and_arch(usable):
    assert V.requirements.check(_op(32, 4096, 4096, "highest"), H100)  # fp32-exact: rows_fma / 3xTF32
    assert V.requirements.check(_op(128, 4096, 4096), H100)
    assert V.requirements.check(_op(32, 4096, 4096), T.fake_profile("A100"))
    assert V.requirements.check(GemmOp(32, 512, 512, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"), H100)
    assert not V.check(_op(17, 1000, 336), H100) and not V.check(_op(127, 4096, 4096), H100)


def test_the_tiled_tf32_gemms_give_way_at_17_to_64_rows(usable):
    for m in (17, 32, 48, TF32_ROUTED_ROWS):
        op = _op(m, 4096, 4096)
        assert fewrows_tf32_serves(op, H100)
        for name in ("cuda.gemm.wgmma_tf32", "cuda.gemm.mma_tf32"):
            assert any("wgmma_fewrows_tf32" in r for r in BY_NAME[name].check(op, H100)), (name, m)
    # above 64 rows, fp32-exact, x @ B and 16 rows stay where they were
    for op in (_op(96, 4096, 4096), _op(32, 4096, 4096, "highest"), _op(16, 4096, 4096),
               GemmOp(32, 4096, 4096, dtype_a="float32", dtype_b="float32", fp32_precision="high")):
        assert not fewrows_tf32_serves(op, H100), op.describe()
    assert not any("fewrows" in r for r in BY_NAME["cuda.gemm.wgmma_tf32"].check(_op(96, 4096, 4096), H100))


def test_heroes_are_valid_and_store_c_transposed(usable):
    from tracea_cuda.emit import wgmma

    for m, n, k in ((17, 4096, 4096), (48, 1024, 8192), (64, 11008, 4096), (127, 777, 1032)):
        op = _op(m, n, k, epilogue="bias+gelu")
        heroes = V.hero_configs(op, H100)
        assert heroes and all(V.validate_config(op, c, H100) for c in heroes), (m, n, k)
    spec = V.spec(_op(40, 1000, 336), V.hero_configs(_op(40, 1000, 336), H100)[0], None)
    assert spec.out_cm and spec.a_kmajor and spec.b_kmajor and not spec.a_regs
    assert "Cb[(long long)col * M + row]" in wgmma.render(spec)


_hopper = T.require_hopper
gpu = T.gpu_test

SHAPES = [(17, 1000, 336), (24, 4096, 4096), (32, 200, 4104), (40, 1024, 8192), (64, 11008, 512), (77, 130, 2056),
          (127, 777, 1032)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilogue,out_dtype", [("bias+gelu", "float32"), ("none", "float32"), ("bias+silu", "bfloat16")])
@gpu
def test_fewrows_tf32_matches_reference(shape, epilogue, out_dtype):
    profile = _hopper()
    m, n, k = shape
    op = _op(m, n, k, epilogue=epilogue, dtype_out=out_dtype)
    assert not V.check(op, profile), V.check(op, profile)
    t = T.gemm_inputs(op, seed=m + n + k)
    ref = T.gemm_reference(op, t)
    tol = T.tolerance("tf32", op.out_dtype)
    heroes = V.hero_configs(op, profile)
    for config in heroes if epilogue == "bias+gelu" else heroes[:1]:
        for _ in range(2):  # twice: split-K counters left at zero by every launch
            t["out"].fill_(float("nan"))
            V.run(op, config, T.op_args(t), profile)
            err = T.rel_err(t["out"], ref)
            assert err <= tol, (config.key, err)


@gpu
def test_fewrows_tf32_nan_inf_default_path_and_graph():
    import torch

    import tracea

    _hopper()
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        x = torch.randn(40, 4096, device="cuda")
        w = torch.randn(1000, 4096, device="cuda")
        x[3, 4000] = float("nan")
        x[7, 10] = float("inf")
        w[5, 2100] = float("-inf")
        ref = x.double() @ w.double().t()
        for config in V.hero_configs(_op(40, 1000, 4096), T.gpu_profile()):
            out = tracea.ops.matmul(x, w.t(), variant=V.name, config=config)
            assert torch.equal(torch.isnan(out), torch.isnan(ref)), config.key
            assert torch.equal(torch.isinf(out) & (out > 0), torch.isinf(ref) & (ref > 0))
        # the default decision for 32 TF32 rows against a 4096 x 4096 weight, bound calls and a graph replay
        x = torch.randn(32, 4096, device="cuda")
        w = torch.randn(4096, 4096, device="cuda") / 64
        bias = torch.randn(4096, device="cuda")
        x0, w0 = x.clone(), w.clone()
        decision = tracea.get_doctor().decide(_op(32, 4096, 4096, epilogue="bias+gelu"), "cuda:0")
        assert decision.variant.name == V.name

        def call():
            return tracea.ops.matmul(x, w.t(), bias=bias, activation="gelu")

        exact = torch.nn.functional.gelu(x.double() @ w.double().t() + bias.double())
        eager = call()
        assert T.rel_err(eager, exact) <= T.tolerance("tf32", DType.F32)
        assert torch.equal(x, x0) and torch.equal(w, w0)
        for _ in range(3):
            assert torch.equal(call(), eager)
        T.assert_replays_match(call, x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
