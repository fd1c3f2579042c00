"""Hostile values in tuning-cache entries whose fingerprint matches this machine, on the real CPU
backend (skipped without tracea-cpu): before the cached-config rule, ``threads=1000000`` crashed
gemm and conv2d with SIGSEGV, ``kc=2**63-1`` hung a 96x80x72 GEMM and ``threads="x"`` failed the
call with BackendError. Now each entry is ignored with a warning and the ops run (hero configs)."""

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tracea_cpu.plugin")

CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir import Conv2dOp, GemmOp
    from tracea.semantic.config import PipelineConfig
    from tracea.testing import output_error
    from tracea.tuning import cache_file
    from tracea.tuning.cache import get_cache

    d, cache = get_doctor(), get_cache()
    prof = d.profile_for("cpu")
    gemm, conv = GemmOp(96, 80, 72), Conv2dOp(1, 8, 10, 10, 16, 3, 3, padding=(1, 1))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((96, 72), dtype=np.float32), rng.standard_normal((72, 80), dtype=np.float32)
    x, w = rng.standard_normal((1, 8, 10, 10), dtype=np.float32), rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    report = []
    for field, value in json.loads(sys.argv[1]):
        entries = []
        for op in (gemm, conv):
            for c in d.decide(op, "cpu", use_cache=False).candidates:
                if c.variant.backend == "cpu":
                    cfg = c.config.to_dict()
                    cfg["params"][field] = value
                    entries.append(cache.make_entry(op, c.variant, prof, PipelineConfig.from_dict(cfg),
                                                    {"median_s": 1e-9}))
        cache_file.write_entries(cache.path, {e.key: e.to_json() for e in entries})
        cache.reload()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = tracea.ops.matmul(a, b)
            y = tracea.ops.conv2d(x, w, padding=1)
        ref = a.astype(np.float64) @ b
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        sources = [d.decide(op, "cpu").chosen.source for op in (gemm, conv)]
        report.append([field, max(err, output_error(conv, y, {"x": x, "w": w})), sources,
                       sum("ignoring tuning-cache entry" in str(s.message) for s in seen)])
    print(json.dumps(report))
""")

CASES = [["threads", 1000000], ["kc", 2**63 - 1], ["threads", "x"], ["mc", -5], ["nc", 1.5], ["threads", True],
         ["indirect", 7], ["mr", 10**30]]


def test_hostile_cached_cpu_configs_are_ignored_and_ops_run(subprocess_env):
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=subprocess_env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report) == len(CASES)
    for field, err, sources, warned in report:
        assert err < 1e-5, field
        assert sources == ["hero", "hero"] and warned >= 2, (field, sources, warned)
