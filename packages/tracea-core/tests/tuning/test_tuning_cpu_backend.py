"""The issue's acceptance path on the real CPU backend (skipped when tracea-cpu is not importable):
tune a GEMM and a conv2d, persist them, and dispatch with the cached configs in a new process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tracea_cpu.plugin")

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir import Conv2dOp, GemmOp
    from tracea.tuning.autotuner import AutoTuner
    gemm, conv = GemmOp(96, 80, 64), Conv2dOp(1, 8, 10, 10, 16, 3, 3, padding=(1, 1))
    d = get_doctor()
    if sys.argv[1] == "tune":
        tuner = AutoTuner(trials=4, seed=0, sampler="tpe", progress=False, min_repeats=3, max_repeats=3,
                          budget_s=0.01)
        res = [tuner.tune(op, "cpu", v) for op, v in ((gemm, "cpu.gemm.avx2"), (conv, "cpu.conv2d.avx2"))]
        print(json.dumps({"configs": [r.config.key for r in res], "cached": [r.from_cache for r in res]}))
    else:
        rng = np.random.default_rng(1)
        a, b = rng.standard_normal((96, 64), dtype=np.float32), rng.standard_normal((64, 80), dtype=np.float32)
        x = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
        w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
        tracea.ops.matmul(a, b)
        tracea.ops.conv2d(x, w, padding=1)
        out = []
        for op, v in ((gemm, "cpu.gemm.avx2"), (conv, "cpu.conv2d.avx2")):
            c = next(c for c in d.decide(op, "cpu").candidates if c.variant.name == v)
            out.append([c.source, c.config.key])
        print(json.dumps(out))
""")


def _run(env, mode):
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cpu_backend_tune_persist_and_dispatch_from_cache(subprocess_env):
    env = dict(subprocess_env)
    env.setdefault("TRACEA_PLUGINS", "cpu=tracea_cpu.plugin")
    probe = subprocess.run([sys.executable, "-c", "from tracea.doctor.doctor import get_doctor; "
                            "print(' '.join(v.name for v in get_doctor().variants()))"],
                           env=env, capture_output=True, text=True, timeout=120)
    if "cpu.gemm.avx2" not in probe.stdout:
        pytest.skip("the CPU backend's AVX2 variants are not available here")
    tuned = _run(env, "tune")
    assert tuned["cached"] == [False, False]
    again = _run(env, "tune")
    assert again["cached"] == [True, True] and again["configs"] == tuned["configs"]
    dispatched = _run(env, "dispatch")
    assert dispatched == [["cache", tuned["configs"][0]], ["cache", tuned["configs"][1]]]
    assert os.path.exists(env["TRACEA_CACHE_PATH"])
