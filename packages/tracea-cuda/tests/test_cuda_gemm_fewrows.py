"""``cuda.gemm.wgmma_fewrows`` (x @ W.T of 17-127 rows computed as C^T = W x^T on Hopper): what it serves and
declines, its heroes on an H100 profile, the rendered store, then GPU runs against a float64 reference over
odd shapes, dtypes, epilogues and output dtypes, NaN / Inf propagation, the bound path and CUDA-graph replay."""

from __future__ import annotations

import pytest

from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.emit import wgmma
from tracea_cuda.variants.hopper_fewrows import MAX_ROWS, WgmmaFewRows, slices, stages_for

H100 = T.fake_profile("H100")
V = WgmmaFewRows()


@pytest.fixture
def usable(monkeypatch):
    """CuPy reported usable, so ``check`` shows the variant's own reasons on a machine without it."""
    from tracea_cuda import toolkit

    monkeypatch.setattr(toolkit, "status", lambda: (True, ""))


def _op(m: int, n: int, k: int, dt: str = "bfloat16", **kw) -> GemmOp:
    return GemmOp(m, n, k, trans_b=True, dtype_a=dt, dtype_b=dt, **kw)


@pytest.mark.parametrize("op,why", [
    (_op(16, 4096, 4096), "skinny_mma"),
    (GemmOp(32, 4100, 4096, dtype_a="bfloat16", dtype_b="bfloat16"), "N=4100 not a multiple of 8"),
    (GemmOp(32, 4096, 4096, trans_a=True, trans_b=True, dtype_a="float16", dtype_b="float16"), "x (M, K) row-major"),
    (_op(32, 4096, 4100), "multiple of 8"),
])
def test_declines_what_it_does_not_serve_with_a_reason(op, why, usable):
    reasons = V.check(op, H100)
    assert reasons and any(why in r for r in reasons), reasons


def test_requirements_bound_rows_batch_and_dtype(usable):
    assert V.requirements.check(_op(MAX_ROWS + 1, 4096, 4096), H100)
    assert V.requirements.check(GemmOp(32, 512, 512, batch=2, trans_b=True, dtype_a="float16", dtype_b="float16"), H100)
    assert V.requirements.check(GemmOp(32, 512, 512, trans_b=True), H100)  # float32
    assert V.requirements.check(_op(32, 512, 512), T.fake_profile("A100"))
    assert not V.check(_op(17, 1000, 336), H100) and not V.check(_op(MAX_ROWS, 4096, 4096), H100)


def test_kernel_op_swaps_the_operands_and_stores_c_transposed():
    op = _op(40, 1000, 336, epilogue="bias+gelu", dtype_out="float32")
    kop = V.kernel_op(op)
    assert (kop.m, kop.n, kop.k, kop.trans_a, kop.trans_b) == (1000, 40, 336, False, True)
    cfg = V.hero_configs(op, H100)[0]
    spec = V.spec(op, cfg, None)
    assert spec.out_cm and spec.a_kmajor and spec.b_kmajor and not spec.a_regs and not spec.smem_epilogue
    src = wgmma.render(spec)
    assert "fragment order" in src and "Cb[(long long)col * M + row]" in src
    assert V.operands(op, None, {"a": 1, "b": 2}, None) == (2, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("m,n,k,first", [(17, 4096, 4096, "pingpong"), (32, 2048, 2048, "pingpong"),
                                         (64, 11008, 4096, "whole"), (48, 1024, 8192, "split"),
                                         (112, 8192, 8192, "pingpong"), (96, 13824, 5120, "whole"),
                                         (20, 1000, 336, "pingpong"), (24, 768, 3072, "pingpong"),
                                         (127, 4096, 4096, "pingpong")])
def test_heroes_are_valid_and_follow_the_wave_rule(m, n, k, first):
    """64-row ping-pong tiles where they fit one wave, 128-row tiles where they do not, a K split first only
    where the 128-row tiles leave most SMs idle over a long K (W1024x8192: 8 tiles on 132 SMs)."""
    op = _op(m, n, k)
    heroes = V.hero_configs(op, H100)
    assert heroes and all(V.validate_config(op, c, H100) for c in heroes)
    assert len({c.key for c in heroes}) == len(heroes)
    c = heroes[0]
    assert c.tile_n == -(-m // 16) * 16 and c.stages == stages_for(c.tile_n) and not c.get("smem_epilogue")
    kind = ("pingpong" if c.get("schedule") == "pingpong" else "split" if (c.get("split_k") or 1) > 1 else "whole")
    assert kind == first, c.key
    assert c.tile_m == (64 if kind == "pingpong" else 128)
    if kind == "split":
        s = int(c.get("split_k"))
        assert s == slices(n, k, 132, max_slices=8) and -(-n // 128) * s <= 132 and -(-k // 64) // s >= 8


def test_the_doctor_picks_it_for_batched_decode_rows(monkeypatch):
    doctor = T.doctor_on(monkeypatch, H100)
    for m in (17, 24, 32, 48, 64, 96):
        for n, k in ((4096, 4096), (11008, 4096), (5120, 5120)):
            assert doctor.decide(_op(m, n, k), "cuda:0").variant.name == V.name, (m, n, k)
    assert doctor.decide(_op(16, 4096, 4096), "cuda:0").variant.name == "cuda.gemm.skinny_mma"
    assert doctor.decide(_op(128, 4096, 4096), "cuda:0").variant.name == "cuda.gemm.wgmma"


_hopper = T.require_hopper
gpu = T.gpu_test

SHAPES = [(17, 1000, 336), (24, 4096, 4096), (32, 200, 4104), (40, 1024, 8192), (64, 11008, 512), (77, 130, 2056),
          (96, 4096, 1032), (112, 520, 4096), (127, 777, 1032)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt,epilogue,out_dtype", [("bfloat16", "bias+gelu", None), ("float16", "none", None),
                                                   ("bfloat16", "bias+silu", "float32"),
                                                   ("float16", "bias+relu", "bfloat16")])
@gpu
def test_fewrows_matches_reference(shape, dt, epilogue, out_dtype):
    profile = _hopper()
    m, n, k = shape
    op = _op(m, n, k, dt, epilogue=epilogue, dtype_out=out_dtype or dt)
    assert not V.check(op, profile), V.check(op, profile)
    t = T.gemm_inputs(op, seed=m + n + k)
    ref = T.gemm_reference(op, t)
    tol = T.tolerance({"bfloat16": "bf16", "float16": "f16"}[dt], op.out_dtype)
    heroes = V.hero_configs(op, profile)
    for config in heroes if epilogue == "bias+gelu" else heroes[:1]:
        assert V.validate_config(op, config, profile), config.key
        for _ in range(2):  # twice: split-K counters left at zero by every launch
            t["out"].fill_(float("nan"))
            V.run(op, config, T.op_args(t), profile)
            err = T.rel_err(t["out"], ref)
            assert err <= tol, (config.key, err)


def test_kernel_op_of_a_kn_b_reads_it_mn_major(usable):
    """x @ B with B stored (K, N): B becomes the kernel's MN-major A (any row count: no 16-bit weight-streaming
    kernel reads that layout)."""
    op = GemmOp(8, 4096, 1024, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias")
    assert not V.check(op, H100)
    kop = V.kernel_op(op)
    assert (kop.m, kop.n, kop.k, kop.trans_a, kop.trans_b) == (4096, 8, 1024, True, True)
    spec = V.spec(op, V.hero_configs(op, H100)[0], None)
    assert spec.out_cm and not spec.a_kmajor and spec.b_kmajor


@pytest.mark.parametrize("shape", [(1, 4096, 1024), (5, 1000, 336), (16, 1024, 8192), (17, 520, 4104), (40, 2048, 2048),
                                   (127, 776, 1032)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt,epilogue", [("bfloat16", "bias+gelu"), ("float16", "none")])
@gpu
def test_fewrows_kn_b_matches_reference(shape, dt, epilogue):
    profile = _hopper()
    m, n, k = shape
    op = GemmOp(m, n, k, dtype_a=dt, dtype_b=dt, epilogue=epilogue)
    assert not V.check(op, profile), V.check(op, profile)
    t = T.gemm_inputs(op, seed=m + n)
    ref = T.gemm_reference(op, t)
    tol = T.tolerance({"bfloat16": "bf16", "float16": "f16"}[dt], op.out_dtype)
    for config in V.hero_configs(op, profile):
        t["out"].fill_(float("nan"))
        V.run(op, config, T.op_args(t), profile)
        assert T.rel_err(t["out"], ref) <= tol, config.key


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@gpu
def test_fewrows_propagates_nan_and_inf(dt):
    import torch

    import tracea

    profile = _hopper()
    dtype = getattr(torch, dt)
    x = torch.randn(40, 4096, device="cuda", dtype=dtype)
    w = torch.randn(1000, 4096, device="cuda", dtype=dtype)
    x[3, 4000] = float("nan")      # row 3 all NaN (late K slice)
    x[7, 10] = float("inf")        # row 7: +inf where w > 0, -inf where w < 0 (first K slice)
    w[5, 2100] = float("-inf")     # column 5: +-inf / NaN (middle slice)
    ref = (x.double() @ w.double().t()).to(dtype)
    for config in V.hero_configs(_op(40, 1000, 4096, dt), profile):
        out = tracea.ops.matmul(x, w.t(), variant=V.name, config=config)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), config.key
        assert torch.equal(torch.isinf(out) & (out > 0), torch.isinf(ref) & (ref > 0))
        assert torch.equal(torch.isinf(out) & (out < 0), torch.isinf(ref) & (ref < 0))


@gpu
def test_fewrows_default_path_bound_calls_and_cuda_graph_replay():
    """tracea.ops picks the variant for 32 rows against a 4096 x 4096 weight; repeated bound calls and a
    CUDA graph of the call (per-call split-K scratch) equal an eager call; x and W untouched."""
    import torch

    import tracea
    from tracea.ir.ops import GemmOp as G

    _hopper()
    x = torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x0, w0 = x.clone(), w.clone()
    decision = tracea.get_doctor().decide(G(32, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16",
                                            epilogue="bias+silu"), "cuda:0")
    assert decision.variant.name == V.name

    def call():
        return tracea.ops.matmul(x, w.t(), bias=bias, activation="silu")

    ref = torch.nn.functional.silu(x.double() @ w.double().t() + bias.double())
    eager = call()
    assert T.rel_err(eager, ref) <= 1e-2
    assert torch.equal(x, x0) and torch.equal(w, w0)
    for _ in range(3):
        assert torch.equal(call(), eager)
    T.assert_replays_match(call, x)
