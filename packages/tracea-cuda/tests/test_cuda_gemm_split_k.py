"""Split-K of the Hopper GEMM (``split_k`` config param: every tile's K range cut into slices, partial sums
added in-kernel by the slice-0 unit): the unit order on the CPU, then GPU runs against a float64 reference
over odd shapes, dtypes, transposes, epilogues and output dtypes, NaN / Inf propagation, the bound (plan
cache) path and CUDA-graph capture + replay."""

from __future__ import annotations

import pytest

from tracea.ir.ops import GemmOp

from tracea_cuda import stream_k
from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.hopper import _hero

VARIANTS = {v.name: v for v in all_variants()}


@pytest.mark.parametrize("tiles,k_iters,splits", [(32, 128, 4), (16, 64, 8), (40, 80, 3), (6, 32, 8), (7, 9, 9),
                                                  (66, 17, 2), (1, 3, 3)])
def test_split_units_cover_every_iteration_once_one_unit_per_cta(tiles, k_iters, splits):
    ctas = tiles * splits  # the host caps splits so that every piece is resident (one unit per CTA)
    seen: dict[tuple[int, int], int] = {}
    slices: dict[int, set[int]] = {}
    for b in range(ctas):
        work = stream_k.split_units(b, tiles, ctas, k_iters, splits)
        assert len(work) == 1
        t, kb, ke, s = work[0]
        assert 0 <= kb < ke <= k_iters, "no empty slice while splits <= k_iters"
        slices.setdefault(t, set()).add(s)
        for k in range(kb, ke):
            seen[(t, k)] = seen.get((t, k), 0) + 1
    assert len(seen) == tiles * k_iters and set(seen.values()) == {1}
    assert all(v == set(range(splits)) for v in slices.values())


def test_split_plan_caps_slices_and_sizes_the_scratch():
    from tracea_cuda.device import isa_flags
    from tracea.doctor.profile import DeviceProfile
    from tracea.ir.device import Device

    h100 = DeviceProfile(Device("cuda", 0), "H100 (fake)", backend="cuda", arch="sm_90a", compute_units=132,
                         compute_capability=(9, 0), warp_size=32, isa=isa_flags((9, 0)))
    v = VARIANTS["cuda.gemm.wgmma"]
    op = GemmOp(512, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")
    splits, tiles, size = v.split_plan(op, _hero(128, 6, cluster=1, split_k=4), h100)
    assert (splits, tiles) == (4, 32) and size == 128 + 32 * 4 * 128 * 128  # 4 counters a tile, then partials
    # K = 100: two 64-wide k tiles; 40 tiles: at most 3 pieces each on 132 SMs; 200 tiles: no split
    assert v.split_plan(GemmOp(256, 256, 100, dtype_a="float16", dtype_b="float16"),
                        _hero(128, 6, cluster=1, split_k=8), h100)[0] == 2
    assert v.split_plan(GemmOp(640, 1024, 4096, dtype_a="float16", dtype_b="float16"),
                        _hero(128, 6, cluster=1, split_k=8), h100)[0] == 3
    assert v.split_plan(GemmOp(2560, 1280, 4096, dtype_a="float16", dtype_b="float16"),
                        _hero(128, 6, cluster=1, split_k=4), h100)[::2] == (1, 0)
    # under MPS with a share of the SMs, the pieces of every tile must still be resident together
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")  # 66 SMs: 32 tiles x 2 slices
        assert v.split_plan(op, _hero(128, 6, cluster=1, split_k=4), h100)[0] == 2
        mp.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "20")  # 26 SMs < 32 tiles: no split
        assert v.split_plan(op, _hero(128, 6, cluster=1, split_k=4), h100)[::2] == (1, 0)
        mp.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "junk")  # unreadable: the whole GPU
        assert v.split_plan(op, _hero(128, 6, cluster=1, split_k=4), h100)[0] == 4
    for bad in (_hero(128, 6, cluster=1, split_k=4, stream_k=True), _hero(128, 6, cluster=2, split_k=4),
                _hero(128, 6, cluster=1, split_k=4, schedule="pingpong")):
        assert not v.validate_config(op, bad, h100)


_hopper = T.require_hopper


gpu = T.gpu_test

SHAPES = [(512, 1024, 8192, 1, False, True), (129, 200, 1000, 1, False, True), (333, 97, 2056, 1, False, False),
          (96, 768, 2048, 2, True, True), (1, 136, 4096, 1, False, True), (200, 384, 520, 3, True, False)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt,epilogue,out_dtype", [("bfloat16", "bias+gelu", None), ("float16", "none", None),
                                                   ("bfloat16", "bias+silu", "float32"),
                                                   ("float16", "bias+relu", "bfloat16"),
                                                   ("float32", "bias+gelu_erf", None)])
@pytest.mark.parametrize("splits", [2, 3, 8])
@gpu
def test_split_k_gemm_matches_reference(shape, dt, epilogue, out_dtype, splits):
    profile = _hopper()
    m, n, k, batch, ta, tb = shape
    kw = {"fp32_precision": "high"} if dt == "float32" else {}
    if dt == "float32" and k % 4:
        pytest.skip("TF32 Hopper GEMM needs K % 4 == 0")
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, dtype_a=dt, dtype_b=dt, epilogue=epilogue,
                dtype_out=out_dtype or dt, **kw)
    v = VARIANTS["cuda.gemm.wgmma_tf32" if dt == "float32" else "cuda.gemm.wgmma"]
    if v.check(op, profile):
        pytest.skip(f"declined: {v.check(op, profile)}")
    direct = dt == "float32" and not v.kmajor(v.kernel_op(op))[0]  # TF32 register-fed A: direct epilogue
    configs = [_hero(128, 6, cluster=1, split_k=splits, smem_epilogue=not direct)]
    if epilogue == "bias+gelu":  # the other tiles (each config is one more compile)
        configs += [_hero(256, 4, cluster=1, split_k=splits, smem_epilogue=not direct),
                    _hero(128, 4, bm=256, cluster=1, split_k=splits, smem_epilogue=not direct),
                    _hero(64, 8, cluster=1, split_k=splits, smem_epilogue=not direct)]
    t = T.gemm_inputs(op, seed=m + n + splits)
    ref = T.gemm_reference(op, t)
    tol = T.tolerance({"bfloat16": "bf16", "float16": "f16", "float32": "tf32"}[dt], op.out_dtype)
    for config in configs:
        assert v.validate_config(op, config, profile), config.key
        for _ in range(2):  # twice: fresh counters per call
            t["out"].fill_(float("nan"))
            v.run(op, config, T.op_args(t), profile)
            err = T.rel_err(t["out"], ref)
            assert err <= tol, (config.key, err)


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
@gpu
def test_split_k_propagates_nan_and_inf(dt):
    import torch

    _hopper()
    torch.backends.cuda.matmul.allow_tf32 = dt == "float32"
    try:
        dtype = getattr(torch, dt)
        x = torch.randn(200, 4096, device="cuda", dtype=dtype)
        w = torch.randn(384, 4096, device="cuda", dtype=dtype)
        x[3, 4000] = float("nan")      # row 3 all NaN (late K slice)
        x[7, 10] = float("inf")        # row 7: +inf where w > 0, -inf where w < 0 (first K slice)
        w[5, 2100] = float("-inf")     # column 5: +-inf / NaN (middle slice)
        variant = "cuda.gemm.wgmma_tf32" if dt == "float32" else "cuda.gemm.wgmma"
        for splits in (2, 4):
            out = tracea_matmul(x, w.t(), variant, _hero(128, 6, cluster=1, split_k=splits))
            ref = (x.double() @ w.double().t()).to(dtype)
            assert torch.equal(torch.isnan(out), torch.isnan(ref))
            assert torch.equal(torch.isinf(out) & (out > 0), torch.isinf(ref) & (ref > 0))
            assert torch.equal(torch.isinf(out) & (out < 0), torch.isinf(ref) & (ref < 0))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def tracea_matmul(a, b, variant, config, **kw):
    import tracea

    return tracea.ops.matmul(a, b, variant=variant, config=config, **kw)


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
@gpu
def test_split_k_bound_path_and_cuda_graph_replay_equal_eager(dt):
    """tracea.ops (the plan cache's pointer-only launch with per-call scratch) and a CUDA graph of it."""
    import torch

    _hopper()
    dtype = getattr(torch, dt)
    prec = "high" if dt == "float32" else None
    variant = "cuda.gemm.wgmma_tf32" if dt == "float32" else "cuda.gemm.wgmma"
    cfg = _hero(128, 6, cluster=1, split_k=4)
    x = torch.randn(384, 3000, device="cuda", dtype=dtype)
    w = torch.randn(1000, 3000, device="cuda", dtype=dtype)
    bias = torch.randn(1000, device="cuda", dtype=dtype)

    def call():
        return tracea_matmul(x, w.t(), variant, cfg, bias=bias, activation="silu", fp32_precision=prec)

    ref = torch.nn.functional.silu(x.double() @ w.double().t() + bias.double())
    eager = call()
    tol = 5e-3 if dt == "float32" else 1e-2
    assert T.rel_err(eager, ref) <= tol
    for _ in range(3):  # repeated bound calls: the stream's counters left at zero by every launch
        assert torch.equal(call(), eager)
    T.assert_replays_match(call, x)


@gpu
def test_split_k_launchers_share_the_stream_scratch_across_shapes_and_streams():
    """Bound split-K launchers of different shapes (different tile counts, slices and workspace sizes)
    alternate on one stream, then on a second stream, through the one per-stream scratch
    (``launcher.split_scratch``): every call equals the float64 reference, so every launch found its
    counters at zero -- a counter left non-zero hangs or corrupts the next launch that uses it."""
    import torch

    from tracea_cuda import launcher

    _hopper()
    cases = []
    for m, n, k, split in ((384, 1000, 3000, 4), (130, 520, 4100, 8), (512, 1024, 8192, 2), (64, 256, 999, 3)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().t()
        cases.append((x, w, ref, _hero(128, 6, cluster=1, split_k=split)))
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        with torch.cuda.stream(stream):
            for _ in range(3):
                for x, w, ref, cfg in cases:
                    assert T.rel_err(tracea_matmul(x, w.t(), "cuda.gemm.wgmma", cfg), ref) <= 1e-2
        stream.synchronize()
    keys = {key for key in launcher._split_buffers if key[0] == torch.cuda.current_device()}
    assert len(keys) >= 2, "each stream has its own split scratch"


@gpu
def test_prepass_launchers_share_the_stream_scratch_across_shapes_streams_and_threads():
    """3xTF32 GEMMs (a split pre-pass, then the kernel reading it) of different sizes alternate on one
    stream, on a second stream and from two threads on one stream, all through the stream's kept
    pre-pass scratch (``launcher.prepass_scratch``): every result equals the float64 reference, so no
    pre-pass rewrote a buffer another call's kernel had yet to read."""
    import threading

    import torch

    from tracea_cuda import launcher

    _hopper()
    cases = []
    for m, n, k in ((300, 520, 1000), (96, 1024, 4096), (1030, 200, 516)):
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda")
        cases.append((x, w, x.double() @ w.double().t()))

    def run_all(rounds: int) -> list[float]:
        return [T.rel_err(tracea_matmul(x, w.t(), "cuda.gemm.wgmma_3xtf32", None, fp32_precision="highest"), ref)
                for _ in range(rounds) for x, w, ref in cases]

    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        with torch.cuda.stream(stream):
            assert max(run_all(3)) <= 1e-5
        stream.synchronize()
    keys = {key for key in launcher._prepass_buffers if key[0] == torch.cuda.current_device()}
    assert len(keys) >= 2, "each stream has its own pre-pass scratch"
    errs: list[float] = []
    threads = [threading.Thread(target=lambda: errs.extend(run_all(4))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert len(errs) == 2 * 4 * len(cases) and max(errs) <= 1e-5
    launcher.release_scratch()
    assert not launcher._prepass_buffers
    assert max(run_all(1)) <= 1e-5  # allocated again on demand
