"""GPU tests of the CUDA runtime pieces: CuPy arrays, streams, compile/launch errors, caches."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.errors import CompilationError
from tracea.ir.ops import GemmOp

from tracea_cuda import compiler, testing as T
from tracea_cuda.variants import all_variants

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANTS = {v.name: v for v in all_variants()}


def test_profile_facts():
    p = T.gpu_profile()
    assert p.compute_units > 0 and p.shared_mem_per_block >= 48 * 1024 and p.caches["L2"] > 0
    assert p.compute_capability and p.driver_version and p.extras["nvrtc"]


def test_cupy_arrays_zero_copy():
    import cupy as cp

    from tracea_cuda.arrays import CupyAdapter

    op = GemmOp(96, 80, 72, dtype_a="float16", dtype_b="float16", epilogue="bias+relu")
    rng = np.random.default_rng(1)
    a = cp.asarray(rng.standard_normal((1, 96, 72)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((1, 72, 80)).astype(np.float16))
    bias = cp.asarray(rng.standard_normal(80).astype(np.float16))
    out = cp.full((1, 96, 80), np.nan, dtype=np.float16)
    v = VARIANTS["cuda.gemm.mma_f16"]
    v.run(op, v.hero_configs(op, T.gpu_profile())[0], OpArgs({"a": a, "b": b, "bias": bias}, out, CupyAdapter()),
          T.gpu_profile())
    ref = np.maximum(cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64) +
                     cp.asnumpy(bias).astype(np.float64), 0)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    info = CupyAdapter().info(out)
    assert info.device.kind == "cuda" and info.shape == (1, 96, 80)


def test_launches_on_torch_current_stream():
    import torch

    op = GemmOp(512, 512, 512, dtype_a="bfloat16", dtype_b="bfloat16")
    v = VARIANTS["cuda.gemm.mma_f16"]
    t = T.gemm_inputs(op)
    cfg = v.hero_configs(op, T.gpu_profile())[0]
    v.run(op, cfg, T.op_args(t), T.gpu_profile())  # compile and cache the launch plan first
    torch.cuda.synchronize()
    t["out"].fill_(float("nan"))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of busy side stream; our kernel must queue behind it
        v.run(op, cfg, T.op_args(t), T.gpu_profile())
        done = torch.cuda.Event()
        done.record(s)
    assert not done.query(), "kernel did not queue on torch's current stream"
    s.synchronize()
    assert T.rel_err(t["out"], T.gemm_reference(op, t)) < 1e-2


def test_compile_error_has_log_and_context_survives():
    with pytest.raises(CompilationError) as exc:
        compiler.load('extern "C" __global__ void broken() { this is not C++; }', "broken", "sm_80",
                      smem=0, threads=32)
    assert "broken" in str(exc.value) and exc.value.log
    test_cupy_arrays_zero_copy()  # the context is still usable


def test_disk_cache_hit_in_second_process(tmp_path):
    code = ("from tracea.ir.ops import GemmOp\n"
            "from tracea_cuda import compiler, testing as T\n"
            "from tracea_cuda.variants import all_variants\n"
            "v = [x for x in all_variants() if x.name == 'cuda.gemm.mma_f16'][0]\n"
            "op = GemmOp(64, 64, 64, dtype_a='float16', dtype_b='float16')\n"
            "v.prepare(op, v.hero_configs(op, T.gpu_profile())[0], T.gpu_profile())\n"
            "print(compiler.STATS['compiled'], compiler.STATS['disk_hits'])\n")
    env = dict(os.environ, TRACEA_CUDA_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["1", "0"], first.stdout + first.stderr
    assert second.stdout.split() == ["0", "1"], second.stdout + second.stderr


def test_concurrent_loads_share_one_module(tmp_path, monkeypatch):
    """Threads that miss the memory cache at once (the arbiter's build workers) all get the module kept
    there: launchers hold raw function handles, and a module no one kept is unloaded when its Kernel is
    dropped (its launches then failed with CUDA_ERROR_INVALID_HANDLE)."""
    import gc
    import threading
    import uuid

    import cupy as cp

    monkeypatch.setenv("TRACEA_CUDA_CACHE_DIR", str(tmp_path))
    token = uuid.uuid4().hex[:8]  # a source no earlier test loaded
    src = ('extern "C" __global__ void tr_fill_%s(float* p, int n) {\n'
           '    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 7.0f; }\n' % token)
    name = f"tr_fill_{token}"
    arch = f"sm_{cp.cuda.Device().compute_capability}"
    workers = 4
    barrier = threading.Barrier(workers)
    real = compiler._nvrtc_cubin

    def compile_together(*args):  # every thread compiles before any stores: all of them missed
        out = real(*args)
        barrier.wait(timeout=120)
        return out

    monkeypatch.setattr(compiler, "_nvrtc_cubin", compile_together)
    dev = cp.cuda.runtime.getDevice()
    got: list = [None] * workers

    def load(i):
        cp.cuda.Device(dev).use()
        got[i] = compiler.load(src, name, arch, smem=0, threads=32)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(k is got[0] for k in got), "every thread must get the kept kernel"
    handles = [int(k.function.ptr) for k in got]
    got.clear()
    gc.collect()
    out = cp.zeros(100, dtype=cp.float32)
    p_val, n_val = np.array([out.data.ptr], dtype=np.uint64), np.array([100], dtype=np.int32)
    params = np.array([p_val.ctypes.data, n_val.ctypes.data], dtype=np.uint64)  # void *kernelParams[]
    for h in handles:  # every handle handed out still names a loaded function
        assert cp.cuda.driver.funcGetAttribute(0, h) > 0  # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        out.fill(0)
        cp.cuda.driver.launchKernel(h, 4, 1, 1, 32, 1, 1, 0, 0, params.ctypes.data, 0)
        cp.cuda.runtime.deviceSynchronize()
        assert float(out.sum()) == 700.0
