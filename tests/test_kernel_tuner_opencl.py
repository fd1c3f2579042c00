"""tracea.tune_kernel / run_kernel with OpenCL kernels (pyopencl; the CPU OpenCL runtime here and in CI)."""

from __future__ import annotations

import numpy as np
import pytest

import tracea

pytestmark = pytest.mark.opencl

VADD = r"""
__kernel void vector_add(__global float *c, __global const float *a, __global const float *b, int n) {
    int i = get_global_id(0) * tile;
    for (int j = 0; j < tile; j++)
        if (i + j < n) c[i + j] = a[i + j] + b[i + j];
}
"""

# a 2D kernel: transpose with a local-memory tile of block_size_x x block_size_y
TRANSPOSE = r"""
__kernel void transpose(__global float *out, __global const float *in, int w, int h) {
    __local float tile_buf[block_size_y][block_size_x + pad];
    int x = get_global_id(0), y = get_global_id(1);
    int lx = get_local_id(0), ly = get_local_id(1);
    if (x < w && y < h) tile_buf[ly][lx] = in[y * w + x];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (x < w && y < h) out[x * h + y] = tile_buf[ly][lx];
}
"""


@pytest.fixture(autouse=True)
def opencl_present(tmp_path, monkeypatch):
    from tracea_opencl import runtime

    st = runtime.status()
    if not st.available:
        pytest.skip(st.reason)
    from tracea.tuning.cache import TuningCache, set_cache

    set_cache(TuningCache(tmp_path / "cache.json"))
    monkeypatch.chdir(tmp_path)
    yield
    set_cache(None)


@pytest.mark.parametrize("n", [1, 1000, 100003])
def test_vector_add_brute_force_verified(rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = np.zeros_like(a)
    tp = {"block_size_x": [16, 64, 256], "tile": [1, 3, 4]}
    results, env = tracea.tune_kernel("vector_add", VADD, n, [c, a, b, np.int32(n)], tp,
                                      grid_div_x=["block_size_x", "tile"], answer=[a + b, None, None, None],
                                      lang="OpenCL", strategy="brute_force", iterations=3, quiet=True)
    assert len(results) == 9 and all(isinstance(r["time"], float) and r["time"] > 0 for r in results)
    assert env["device_name"] and env["tracea_cache"] == "stored"
    assert not c.any()
    out = tracea.run_kernel("vector_add", VADD, n, [c, a, b, np.int32(n)], {"block_size_x": 64, "tile": 3},
                            grid_div_x=["block_size_x", "tile"], lang="OpenCL")
    np.testing.assert_array_equal(out[0], a + b)


def test_2d_grid_and_local_memory(rng):
    w, h = 131, 77
    x = rng.standard_normal((h, w)).astype(np.float32)
    out = np.zeros((w, h), np.float32)
    tp = {"block_size_x": [8, 16, 32], "block_size_y": [1, 4, 8], "pad": [0, 1]}
    results, env = tracea.tune_kernel("transpose", TRANSPOSE, (w, h), [out, x, np.int32(w), np.int32(h)], tp,
                                      restrictions=["block_size_x * block_size_y >= 32"],
                                      answer=[x.T.copy(), None, None, None], lang="OpenCL",
                                      strategy_options={"max_fevals": 6}, iterations=2, quiet=True, tracea_cache=False)
    assert len(results) == 6 and all(r["block_size_x"] * r["block_size_y"] >= 32 for r in results)
    assert "best_config" in env


def test_opencl_mismatch_and_build_error(rng):
    a = rng.standard_normal(64).astype(np.float32)
    c = np.zeros_like(a)
    with pytest.raises(tracea.VerificationError):
        tracea.tune_kernel("vector_add", VADD, 64, [c, a, a, np.int32(64)], {"tile": [1]},
                           answer=[a * 3, None, None, None], lang="OpenCL", quiet=True, tracea_cache=False)
    results, _ = tracea.tune_kernel("vector_add", VADD.replace("tile;", "tile +;"), 64, [c, a, a, np.int32(64)],
                                    {"tile": [1]}, lang="OpenCL", quiet=True, tracea_cache=False)
    assert results[0]["time"] == "CompilationFailedConfig"
    with pytest.raises(tracea.InvalidArgumentError, match="platform"):
        tracea.tune_kernel("vector_add", VADD, 64, [c, a, a, np.int32(64)], {"tile": [1]}, lang="OpenCL", platform=99,
                           quiet=True)
