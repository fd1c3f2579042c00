"""A CuPy program on CUDA (no torch): ``tracea.ops`` with first-use tuning and ``AutoTuner.tune`` build their inputs
with CuPy and never import torch (``ArrayAdapter.stores`` / ``tuning.inputs.pick_adapter``), with correct results.
Runs in a subprocess so torch is not already imported by the test session."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tracea_cuda import testing as T

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

CODE = """
import sys
import numpy as np
import cupy as cp
import tracea, tracea.ops
from tracea.ir.ops import GemmOp
from tracea.tuning.autotuner import AutoTuner
rs = cp.random.RandomState(0)
for dt in (cp.float16, cp.float32):
    a = rs.standard_normal((200, 136)).astype(dt); b = rs.standard_normal((136, 72)).astype(dt)
    out = cp.asnumpy(tracea.ops.matmul(a, b)).astype(np.float64)
    ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max(), dt
res = AutoTuner().tune(GemmOp(256, 384, 128, dtype_a="float16", dtype_b="float16"), "cuda:0", trials=3)
assert res.variant, res
print("torch" in sys.modules)
"""


def test_cupy_program_tunes_without_importing_torch(tmp_path):
    env = {**os.environ, "TRACEA_TUNING": "first-use", "TRACEA_CACHE_PATH": str(tmp_path / "cache.json")}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout
