"""tracea.tune_kernel / run_kernel with C kernels (Kernel Tuner's convention: the function returns its
own time in ms): parameter spaces, restrictions, grid/defines, verification, strategies, both caches."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tracea
from tracea.tuning.cache import TuningCache, set_cache

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="needs a C++ compiler")

SAXPY = r"""
#include <time.h>
extern "C" float saxpy(float *y, const float *x, float alpha, int n) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i += unroll)
        for (int j = 0; j < unroll && i + j < n; j++)
            y[i + j] += alpha * x[i + j];
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (float)((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
}
"""

# Reports its own defines back so the launch conventions can be checked from Python.
DEFINES = r"""
extern "C" float probe(int *out) {
    out[0] = grid_size_x; out[1] = grid_size_y; out[2] = grid_size_z;
    out[3] = block_size_x; out[4] = block_size_y; out[5] = block_size_z;
    out[6] = tile; out[7] = kernel_tuner;
    return 0.01f;
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    cache = TuningCache(tmp_path / "tuning_cache.json")
    set_cache(cache)
    monkeypatch.chdir(tmp_path)
    yield cache
    set_cache(None)


def _saxpy_problem(rng, n=4099):
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    alpha = np.float32(rng.uniform(0.5, 2.0))
    want = (y.astype(np.float64) + float(alpha) * x.astype(np.float64)).astype(np.float32)
    return [y, x, alpha, np.int32(n)], [want, None, None, None]


def test_brute_force_covers_the_restricted_space_and_verifies(rng):
    args, answer = _saxpy_problem(rng)
    y_before = args[0].copy()
    tune_params = {"unroll": [1, 2, 3, 4, 8], "dummy": [0, 1, 2]}
    restrictions = ["unroll != 3", lambda p: p["dummy"] <= p["unroll"]]
    results, env = tracea.tune_kernel("saxpy", SAXPY, args[3], args, tune_params, restrictions=restrictions,
                                      answer=answer, atol=1e-5, lang="C", strategy="brute_force", iterations=3,
                                      quiet=True)
    expected = {(u, d) for u in (1, 2, 4, 8) for d in (0, 1, 2) if d <= u}
    assert {(r["unroll"], r["dummy"]) for r in results} == expected
    assert len(results) == len(expected)
    for r in results:
        assert isinstance(r["time"], float) and r["time"] >= 0 and len(r["times"]) == 3
        assert r["time"] == pytest.approx(np.mean(r["times"]))
        assert set(r) >= {"compile_time", "verification_time", "benchmark_time", "timestamp"}
    assert env["best_config"]["time"] == min(r["time"] for r in results)
    assert env["evaluations"] == len(expected) and env["lang"] == "C" and env["tracea_cache"] == "stored"
    np.testing.assert_array_equal(args[0], y_before)  # the caller's arrays are not written


def test_defines_grid_and_block_follow_kernel_tuners_conventions():
    out = np.zeros(8, np.int32)
    res = tracea.run_kernel("probe", DEFINES, (1000, 70), [out], {"block_size_x": 64, "block_size_y": 4, "tile": 3},
                            grid_div_x=["block_size_x", "tile"], lang="C")
    # grid x = ceil(1000 / (64 * 3)) = 6, y = ceil(70 / 4) = 18, z = 1; block z defaults to 1
    assert list(res[0]) == [6, 18, 1, 64, 4, 1, 3, 1]
    assert not out.any()  # run_kernel leaves the caller's arrays alone and returns the results
    res = tracea.run_kernel("probe", DEFINES, "n * 2", [out], {"block_size_x": 16, "tile": 2, "n": 100},
                            grid_div_x="block_size_x * tile", grid_div_y=lambda p: 1, lang="C")
    assert list(res[0][:3]) == [7, 1, 1]  # ceil(200 / 32)
    res = tracea.run_kernel("probe", DEFINES, 10, [out], {"tile": 5}, block_size_names=["bx"],
                            defines={"grid_size_x": 1, "grid_size_y": 2, "grid_size_z": 3, "block_size_x": "tile * 2",
                                     "block_size_y": 1, "block_size_z": 1, "tile": lambda p: p["tile"] + 1,
                                     "kernel_tuner": 0}, lang="C")
    assert list(res[0]) == [1, 2, 3, 10, 1, 1, 6, 0]


def test_random_sample_and_default_strategy_budgets(rng):
    args, answer = _saxpy_problem(rng, 1001)
    tune_params = {"unroll": [1, 2, 4, 8, 16], "k": [0, 1, 2, 3]}
    results, env = tracea.tune_kernel("saxpy", SAXPY, 1001, args, tune_params, answer=answer, atol=1e-5, lang="C",
                                      strategy="random_sample", strategy_options={"fraction": 0.25}, seed=3,
                                      iterations=2, quiet=True, tracea_cache=False)
    assert len(results) == 5 and env["tracea_cache"] == "off"
    results, env = tracea.tune_kernel("saxpy", SAXPY, 1001, args, tune_params, answer=answer, atol=1e-5, lang="C",
                                      strategy_options={"max_fevals": 7}, iterations=2, quiet=True, tracea_cache=False,
                                      heroes=[{"unroll": 4, "k": 2}])
    assert env["strategy"] == "tracea" and len(results) == 7
    assert (results[0]["unroll"], results[0]["k"]) == (4, 2)  # the hero goes first
    assert len({(r["unroll"], r["k"]) for r in results}) == 7  # never the same config twice


def test_tracea_cache_reuse_retune_and_cache_ls(rng, private_cache, capsys):
    args, answer = _saxpy_problem(rng, 2048)
    tp = {"unroll": [1, 2, 4]}
    r1, e1 = tracea.tune_kernel("saxpy", SAXPY, 2048, args, tp, answer=answer, atol=1e-5, lang="C",
                                strategy="brute_force", iterations=2, quiet=True)
    assert e1["tracea_cache"] == "stored" and len(r1) == 3
    r2, e2 = tracea.tune_kernel("saxpy", SAXPY, 2048, args, tp, answer=answer, atol=1e-5, lang="C",
                                strategy="brute_force", iterations=2, quiet=True)
    assert e2["tracea_cache"] == "hit" and len(r2) == 1 and e2["evaluations"] == 0
    assert r2[0]["unroll"] == e1["best_config"]["unroll"]
    # a restriction that excludes the cached best makes it tune again; so do retune and a new problem
    best = e1["best_config"]["unroll"]
    _, e3 = tracea.tune_kernel("saxpy", SAXPY, 2048, args, tp, restrictions=[f"unroll != {best}"], answer=answer,
                               atol=1e-5, lang="C", iterations=2, quiet=True)
    assert e3["tracea_cache"] == "stored" and e3["best_config"]["unroll"] != best
    _, e4 = tracea.tune_kernel("saxpy", SAXPY, 2048, args, tp, answer=answer, atol=1e-5, lang="C", iterations=2,
                               quiet=True, retune=True)
    assert e4["tracea_cache"] == "stored" and e4["evaluations"] == 3
    args5, answer5 = _saxpy_problem(rng, 999)
    _, e5 = tracea.tune_kernel("saxpy", SAXPY, 999, args5, tp, answer=answer5, atol=1e-5, lang="C", iterations=2, quiet=True)
    assert e5["tracea_cache"] == "stored"
    entries = private_cache.entries()
    assert len(entries) == 2 and all(e.op_key.startswith("user:c:saxpy:") for e in entries)
    assert all(e.variant == "user.c.saxpy" and e.config.get("unroll") in (1, 2, 4) for e in entries)
    from tracea.cli.main import main

    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "C kernel saxpy 2048" in out and "C kernel saxpy 999" in out and "unroll=" in out


def test_kernel_tuner_cache_file_format_and_resume(rng, tmp_path):
    args, answer = _saxpy_problem(rng, 512)
    tp = {"unroll": [1, 2, 4, 8]}
    _, _ = tracea.tune_kernel("saxpy", SAXPY, 512, args, tp, answer=answer, atol=1e-5, lang="C",
                              strategy="brute_force", iterations=2, quiet=True, cache="kt_cache", tracea_cache=False)
    data = json.loads((tmp_path / "kt_cache.json").read_text())  # closed: plain JSON
    assert data["kernel_name"] == "saxpy" and data["tune_params_keys"] == ["unroll"]
    assert data["tune_params"] == {"unroll": [1, 2, 4, 8]} and data["problem_size"] == [512]
    assert sorted(data["cache"]) == ["1", "2", "4", "8"]
    assert all(isinstance(e["time"], float) and e["unroll"] == int(k) for k, e in data["cache"].items())
    # a second run reads every result back from the file instead of compiling
    results, env = tracea.tune_kernel("saxpy", SAXPY, 512, args, tp, answer=answer, atol=1e-5, lang="C",
                                      strategy="brute_force", iterations=2, quiet=True, cache="kt_cache",
                                      tracea_cache=False)
    assert len(results) == 4 and env["total_compile_time"] == 0
    assert {r["time"] for r in results} == {e["time"] for e in data["cache"].values()}
    # Kernel Tuner's open form (no closing brackets, trailing comma) is read too
    text = (tmp_path / "kt_cache.json").read_text()
    (tmp_path / "open.json").write_text(text[:-3] + ",")
    results, _ = tracea.tune_kernel("saxpy", SAXPY, 512, args, tp, lang="C", strategy="brute_force", quiet=True,
                                    cache="open.json", tracea_cache=False)
    assert len(results) == 4
    with pytest.raises(tracea.InvalidArgumentError, match="cache"):
        tracea.tune_kernel("saxpy", SAXPY, 512, args, {"unroll": [1, 2], "x": [0]}, lang="C", quiet=True,
                           cache="kt_cache", tracea_cache=False)


def test_metrics_and_higher_is_better_objective(rng):
    args, answer = _saxpy_problem(rng, 4096)
    results, env = tracea.tune_kernel("saxpy", SAXPY, 4096, args, {"unroll": [1, 2, 4]}, answer=answer, atol=1e-5,
                                      lang="C", strategy="brute_force", iterations=2, quiet=True, tracea_cache=False,
                                      metrics={"GB/s": lambda p: 3 * 4 * 4096 / 1e9 / max(p["time"], 1e-9) * 1e3,
                                               "bw": lambda p: p["GB/s"], "double": "bw * 2 + unroll - unroll"},
                                      objective="GB/s", objective_higher_is_better=True)
    for r in results:
        assert r["double"] == pytest.approx(2 * r["GB/s"])
    assert env["best_config"]["GB/s"] == max(r["GB/s"] for r in results)


def test_compile_error_is_a_failed_config_not_a_crash(rng):
    src = SAXPY.replace("y[i + j] += alpha * x[i + j];", "y[i + j] += alpha * x[i + j] BROKEN_unroll_##unroll;")
    src = src.replace("#include <time.h>", "#include <time.h>\n#if unroll == 2\n#define BROKEN_unroll_2 +1\n#else\n#define BROKEN_unroll_ \n#endif")
    args, answer = _saxpy_problem(rng, 64)
    results, env = tracea.tune_kernel("saxpy", src, 64, args, {"unroll": [1, 2]}, lang="C", strategy="brute_force",
                                      quiet=True, tracea_cache=False)
    assert all(r["time"] == "CompilationFailedConfig" and "__error__" in r for r in results)
    assert "best_config" not in env


def test_default_strategy_when_every_config_fails_or_none_is_valid(rng, capsys):
    src = SAXPY.replace("y[i + j] += alpha * x[i + j];", "y[i + j] += alpha * x[i + j] BROKEN;")
    args, _ = _saxpy_problem(rng, 64)
    tp = {"unroll": [1, 2, 4, 8], "pad": [0, 1, 2]}
    results, env = tracea.tune_kernel("saxpy", src, 64, args, tp, lang="C", tracea_cache=False,
                                      strategy_options={"max_fevals": 5})
    assert len(results) == 5 == len({(r["unroll"], r["pad"]) for r in results})
    assert all("__error__" in r for r in results) and "best_config" not in env
    assert "all 5 evaluated configs failed (CompilationFailedConfig)" in capsys.readouterr().out
    with pytest.raises(tracea.InvalidArgumentError, match="restrictions"):
        tracea.tune_kernel("saxpy", SAXPY, 64, args, tp, lang="C", tracea_cache=False, quiet=True,
                           restrictions=["unroll > 8"])


def test_decorated_kernel_whose_every_config_fails_raises_a_clear_error(rng):
    """``@tracea.kernel(autotune=True)``: when tuning finds no config that runs, the call raises a
    BackendError saying so (with each failure's log), instead of running the first config and failing with
    the compiler's error as if no tuning had happened; the arrays are left untouched."""
    src = SAXPY.replace("y[i + j] += alpha * x[i + j];", "y[i + j] += alpha * x[i + j] BROKEN;")

    @tracea.kernel(target="c", autotune=True, tune_params={"unroll": [1, 2, 4]}, strategy="brute_force",
                   tracea_cache=False)
    def saxpy(y, x, alpha, n):
        return tracea.KernelLaunch(src, problem_size=int(n), name="saxpy")

    args, _ = _saxpy_problem(rng, 64)
    before = args[0].copy()
    with pytest.raises(tracea.BackendError, match="none of the 3 configs tried ran") as info:
        saxpy(*args)
    assert "CompilationFailedConfig" in str(info.value) and info.value.log and np.array_equal(args[0], before)


def test_run_kernel_matches_numpy_on_odd_sizes(rng):
    for n in (1, 7, 1000, 4097):
        args, answer = _saxpy_problem(rng, n)
        out = tracea.run_kernel("saxpy", SAXPY, n, args, {"unroll": 3}, lang="C")
        np.testing.assert_allclose(out[0], answer[0], rtol=1e-6, atol=1e-6)
        assert out[2] == args[2] and out[3] == args[3]


def test_core_imports_no_gpu_toolkit():
    code = ("import sys, tracea; tracea.tune_kernel; tracea.kernel; import tracea.usertune.interface;"
            "bad = [m for m in ('cupy', 'pyopencl', 'torch', 'triton') if m in sys.modules]; print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)
