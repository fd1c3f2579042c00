"""Stream-K split of the Hopper GEMM: the host plan (no GPU) and GPU runs on shapes whose last wave is
partial, so that tiles are split along K and partial sums pass through the workspace."""

from __future__ import annotations

import pytest

from tracea.ir.ops import GemmOp

from tracea_cuda import stream_k
from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.hopper import _hero

VARIANTS = {v.name: v for v in all_variants()}


@pytest.mark.parametrize("tiles,ctas,k_iters", [(512, 132, 64), (2048, 132, 128), (1024, 132, 64), (3584, 132, 64),
                                                (265, 132, 1), (300, 132, 3), (400, 7, 5), (1000, 13, 2)])
def test_plan_covers_every_iteration_once(tiles, ctas, k_iters):
    p = stream_k.plan(tiles, ctas, k_iters)
    seen: dict[tuple[int, int], int] = {}
    for b in range(ctas):
        work = stream_k.units(b, tiles, ctas, k_iters, p.sk_tiles)
        assert work, "every CTA has work"
        waits = [i for i, w in enumerate(work) if w[3] and w[4]]    # owners that wait for partial sums
        gives = [i for i, w in enumerate(work) if not w[3]]         # contributor pieces
        assert not waits or not gives or max(gives) < min(waits), "a CTA contributes before it waits"
        for t, kb, ke, owner, ncon, slot in work:
            assert 0 <= kb < ke <= k_iters
            assert (kb == 0) if owner else (0 <= slot < ncon <= p.max_contributors)
            for k in range(kb, ke):
                seen[(t, k)] = seen.get((t, k), 0) + 1
    assert len(seen) == tiles * k_iters and set(seen.values()) == {1}


def test_plan_declines_small_or_full_grids():
    assert stream_k.plan(130, 132, 64).sk_tiles == 0    # one partial wave: nothing to balance
    assert stream_k.plan(264, 132, 64).sk_tiles == 0    # whole waves
    assert stream_k.plan(512, 132, 64).sk_tiles == 116  # 3 waves + 116


_hopper = T.require_hopper


SHAPES = [(2100, 4000, 1000, 1), (4096, 4096, 520, 1), (1000, 1000, 328, 9), (4224, 2056, 136, 1)]


@pytest.mark.cuda
@pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt,epilogue", [("bfloat16", "bias+gelu"), ("float16", "none"), ("float32", "bias+relu")])
def test_stream_k_gemm(shape, dt, epilogue):
    profile = _hopper()
    m, n, k, batch = shape
    kw = {"fp32_precision": "high"} if dt == "float32" else {}
    op = GemmOp(m, n, k, batch=batch, dtype_a=dt, dtype_b=dt, epilogue=epilogue, **kw)
    v = VARIANTS["cuda.gemm.wgmma_tf32" if dt == "float32" else "cuda.gemm.wgmma"]
    configs = [_hero(256, 4, cluster=1, stream_k=True), _hero(128, 4, bm=256, cluster=1, stream_k=True)]
    if dt == "float32":  # A @ B with B (K, N): the swapped, register-fed kernel (direct epilogue)
        configs = [c.replace(smem_epilogue=False) for c in configs]
    if dt == "bfloat16":  # stream-K with the deferred epilogue (a contributor leaves its pending chunks)
        configs.append(_hero(256, 3, 16, cluster=1, stream_k=True, defer=True))
    t = T.gemm_inputs(op, seed=m + n)
    ref = T.gemm_reference(op, t)
    tol = T.tolerance({"bfloat16": "bf16", "float16": "f16", "float32": "tf32"}[dt], op.out_dtype)
    for config in configs:
        assert v.validate_config(op, config, profile), config.key
        for _ in range(2):  # twice: the tile counters must be back at zero after a launch
            t["out"].fill_(float("nan"))
            v.run(op, config, T.op_args(t), profile)
            err = T.rel_err(t["out"], ref)
            assert err <= tol, (config.key, err)


@pytest.mark.cuda
@pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")
def test_stream_k_bound_path_shares_the_stream_scratch_and_replays_in_graphs():
    """tracea.ops with a stream-K config takes the pointer-only launch: partial sums and tile counters in
    the stream's split scratch (``launcher.split_scratch``, shared with split-K launchers), counters left at
    zero by every launch. Stream-K and split-K launchers of several shapes alternate on one stream; every
    call equals the float64 reference; a CUDA graph of a call (per-call scratch, counters zeroed in the
    graph) replays equal to eager calls."""
    import torch

    import tracea

    _hopper()

    def call(x, w, cfg, bias=None):
        return tracea.ops.matmul(x, w.t(), variant="cuda.gemm.wgmma", config=cfg, bias=bias,
                                 activation="gelu" if bias is not None else None)

    cases = []
    for m, n, k, cfg in ((2100, 4000, 1000, _hero(256, 4, cluster=1, stream_k=True)),
                         (2048, 5632, 2048, _hero(256, 3, 16, cluster=1, stream_k=True, defer=True)),
                         (4224, 2056, 136, _hero(128, 4, bm=256, cluster=1, stream_k=True)),
                         (384, 1000, 3000, _hero(128, 6, cluster=1, split_k=4)),
                         (3001, 1999, 777, _hero(192, 4, cluster=1, stream_k=True))):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if m == 2048 else None
        ref = x.double() @ w.double().t()
        if bias is not None:
            ref = torch.nn.functional.gelu(ref + bias.double(), approximate="tanh")
        cases.append((x, w, bias, ref, cfg))
    first = []
    for _ in range(3):  # alternating launchers on one stream: each found its counters at zero
        for i, (x, w, bias, ref, cfg) in enumerate(cases):
            out = call(x, w, cfg, bias)
            assert T.rel_err(out, ref) <= 1e-2, (cfg.key, T.rel_err(out, ref))
            if len(first) <= i:
                first.append(out)
            else:
                assert torch.equal(out, first[i]), cfg.key
    x, w, bias, ref, cfg = cases[1]
    T.assert_replays_match(lambda: call(x, w, cfg, bias), x)
