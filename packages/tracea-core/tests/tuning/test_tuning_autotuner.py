import json
import math
import subprocess
import sys
import textwrap

import pytest

import tracea_tuning_testplugin as plugin
from tracea.errors import InvalidArgumentError
from tracea.ir import Conv2dOp, Device, GemmOp, ProblemDescriptor, Shape
from tracea.semantic.config import PipelineConfig
from tracea.tuning.autotuner import AutoTuner
from tracea.tuning.cache import TuningCache

FAST = dict(progress=False, sampler="tpe", seed=3, min_repeats=3, max_repeats=5, budget_s=0.005, warmup=1)


def test_tune_gemm_and_conv_persist_to_cache(doctor, cache):
    tuner = AutoTuner(doctor=doctor, trials=10, cache=cache, **FAST)
    gemm = tuner.tune(GemmOp(40, 72, 56))
    conv = tuner.tune(Conv2dOp(1, 6, 9, 9, 10, 3, 3, padding=1))
    for res in (gemm, conv):
        assert res.ok and not res.from_cache
        assert res.variant.startswith("testnp.")
        assert 0 < res.median_s < math.inf
        assert res.measured_trials <= 10
    fresh = TuningCache(cache.path)
    prof = doctor.profile_for("cpu")
    assert fresh.lookup(GemmOp(40, 72, 56), "testnp.gemm.blocked", prof).config == gemm.config
    # the default (first hero) config was measured too: the performance model learns from it
    assert all(0 < e.default_s < math.inf for e in fresh.entries())
    assert fresh.lookup(Conv2dOp(1, 6, 9, 9, 10, 3, 3, padding=1), "testnp.conv2d.blocked", prof).config == conv.config


def test_failures_are_failed_trials_not_crashes(doctor, cache):
    tuner = AutoTuner(doctor=doctor, trials=40, cache=cache, **FAST)
    # One seed per deliberate failure, so every kind is tried whatever the sampler suggests: its later
    # picks follow measured (load-dependent) times, and leaving the kinds to chance made this test flaky.
    def cfg(tm, tn, tk):
        return PipelineConfig(tile_m=tm, tile_n=tn, tile_k=tk, warps=1)
    seeds = [cfg(8, 32, 32), cfg(32, 32, 8), cfg(32, 8, 32), cfg(128, 128, 128)]
    res = tuner.tune(GemmOp(40, 72, 56), seeds=seeds)
    statuses = {t.status for t in res.history}
    assert {"compile_error", "launch_error", "wrong_result", "ok"} <= statuses
    assert "invalid" in statuses  # tm128 x tk128 exceeds the scratch limit: pruned, never run
    ran = set(plugin.RUNS)
    for t in res.history:
        if t.status == "invalid":
            assert t.config.key not in ran and not t.ok
        if t.status != "ok":
            assert t.score_s == math.inf
    assert res.config.tile_m != 8 and res.config.tile_n != 8 and res.config.tile_k != 8


def test_a_run_longer_than_the_timeout_is_a_failed_trial(doctor, cache):
    opts = dict(FAST)
    tuner = AutoTuner(doctor=doctor, trials=5, cache=cache, timeout_s=1.5, **opts)
    sleepy = PipelineConfig(tile_m=16, tile_n=16, tile_k=16, warps=1, params=(("sleep_s", 2.0),))
    res = tuner.tune(GemmOp(24, 24, 24), seeds=[sleepy])
    by_key = {t.config.key: t for t in res.history}
    assert by_key[sleepy.key].status == "timeout" and "timeout" in by_key[sleepy.key].reason
    assert res.ok and res.config != sleepy
    assert res.elapsed_s < 10  # no trial starts after the deadline


def test_importing_the_tuner_does_not_import_optuna_or_torch():
    code = ("import sys, tracea, tracea.tuning.autotuner, tracea.tuning.graph, tracea.tuning.cache, "
            "tracea.cli.tune_cmd, tracea.cli.cache_cmd; "
            "print(sorted(m for m in ('optuna', 'torch', 'matplotlib', 'tqdm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_hero_config_is_tried_first_and_cache_hit_measures_nothing(doctor, cache):
    tuner = AutoTuner(doctor=doctor, trials=4, cache=cache, **FAST)
    op = GemmOp(24, 24, 24)
    first = tuner.tune(op)
    assert first.history[0].source == "hero" and first.history[0].config.tile_m == 32
    plugin.RUNS.clear()
    again = tuner.tune(op)
    assert again.from_cache and again.config == first.config and again.history == []
    assert plugin.RUNS == []
    forced = tuner.tune(op, force=True)
    assert not forced.from_cache and forced.history[0].source == "cache"


def test_seed_api_optimize_and_device_info(doctor, cache):
    prof = doctor.profile_for("cpu")
    tuner = AutoTuner(prof, doctor=doctor, trials=3, cache=cache, **FAST)
    problem = ProblemDescriptor(device=Device.cpu(), shape=Shape(m=32, n=40, k=48))
    config = tuner.optimize(problem)
    assert isinstance(config, PipelineConfig)
    assert cache.lookup(problem.op, "testnp.gemm.blocked", prof).config == config
    with pytest.raises(InvalidArgumentError, match="device_info"):
        AutoTuner("rtx3070")
    with pytest.raises(InvalidArgumentError, match="trials"):
        AutoTuner(trials=0)


def test_goal_is_recorded_per_call(doctor, cache):
    tuner = AutoTuner(doctor=doctor, trials=3, cache=cache, **FAST)
    op = GemmOp(24, 40, 24)
    res = tuner.tune(op, goal="min_latency")
    entry = cache.lookup(op, "testnp.gemm.blocked", doctor.profile_for("cpu"), "min_latency")
    assert entry is not None and entry.goal.value == "min_latency"
    assert entry.score_s == pytest.approx(res.score_s) and entry.score_s >= entry.median_s


def test_default_sampler_is_the_candidate_gp(doctor, cache):
    from tracea.tuning.search import gp_available

    if not gp_available():
        pytest.skip("the candidate-set GP sampler needs numpy and scipy")
    opts = dict(FAST, sampler="auto")
    res = AutoTuner(doctor=doctor, trials=9, cache=cache, **opts).tune(GemmOp(40, 40, 40))
    assert res.sampler == "gp" and res.ok
    sampled = [t for t in res.history if t.source == "sampler"]
    assert len(sampled) >= 5 and all(t.status != "invalid" for t in sampled)
    assert len({t.config.key for t in res.history}) == len(res.history)


@pytest.mark.slow
def test_optuna_gp_sampler_runs_when_available(doctor, cache):
    from tracea.tuning.search import optuna_gp_available

    if not optuna_gp_available():
        pytest.skip("optuna GPSampler needs torch and scipy")
    opts = dict(FAST, sampler="optuna-gp")
    res = AutoTuner(doctor=doctor, trials=9, cache=cache, **opts).tune(GemmOp(40, 40, 40))
    assert res.sampler == "optuna-gp" and res.ok
    assert sum(1 for t in res.history if t.source in ("sampler", "random")) >= 5


CHILD = textwrap.dedent("""
    import json, sys
    import tracea_tuning_testplugin as t
    from tracea.ir import GemmOp, Conv2dOp
    from tracea.tuning.autotuner import AutoTuner
    d = t.make_doctor()
    ops = {"gemm": GemmOp(40, 72, 56), "gemm2": GemmOp(56, 40, 72),
           "conv": Conv2dOp(1, 6, 9, 9, 10, 3, 3, padding=1)}
    res = AutoTuner(doctor=d, trials=6, progress=False, sampler="tpe", seed=1, min_repeats=3, max_repeats=4,
                    budget_s=0.005, warmup=1).tune(ops[sys.argv[1]])
    print(json.dumps({"from_cache": res.from_cache, "runs": len(t.RUNS), "config": res.config.key,
                      "sources": [h.source for h in res.history]}))
""")


DISPATCH = textwrap.dedent("""
    import json
    import numpy as np
    import tracea
    import tracea_tuning_testplugin as t
    from tracea.ir import GemmOp
    d = t.make_doctor()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 56), dtype=np.float32), rng.standard_normal((56, 72), dtype=np.float32)
    out = tracea.ops.matmul(a, b)
    chosen = d.decide(GemmOp(40, 72, 56), "cpu").chosen
    err = float(np.linalg.norm(out - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b))
    print(json.dumps({"runs": t.RUNS, "source": chosen.source, "variant": chosen.variant.name,
                      "config": chosen.config.key, "err": err}))
""")


def test_dispatch_in_a_new_process_runs_the_tuned_config(subprocess_env):
    tuned = _child(subprocess_env, "gemm")
    out = subprocess.run([sys.executable, "-c", DISPATCH], env=subprocess_env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["source"] == "cache" and got["variant"] == "testnp.gemm.blocked"
    assert got["config"] == tuned["config"] and got["runs"] == [tuned["config"]]  # one run: no retuning
    assert got["err"] < 1e-5


def _child(env, which):
    out = subprocess.run([sys.executable, "-c", CHILD, which], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_uses_cache_and_environment_change_retunes(subprocess_env):
    first = _child(subprocess_env, "gemm")
    assert not first["from_cache"] and first["runs"] > 0
    second = _child(subprocess_env, "gemm")
    assert second["from_cache"] and second["runs"] == 0 and second["config"] == first["config"]
    changed = dict(subprocess_env, TESTNP_ENV="new-compiler")
    third = _child(changed, "gemm")
    assert not third["from_cache"] and third["runs"] > 0
    assert third["sources"][0] == "cache"  # the old result seeds the new search


def test_two_processes_tuning_at_once_leave_both_entries(subprocess_env):
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, w], env=subprocess_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for w in ("gemm2", "conv")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    cache = TuningCache(subprocess_env["TRACEA_CACHE_PATH"])
    variants = sorted(e.variant for e in cache.entries())
    assert variants == ["testnp.conv2d.blocked", "testnp.gemm.blocked"]
