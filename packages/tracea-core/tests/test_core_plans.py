"""The plan cache (tracea.runtime.plans): one plan per call signature, reused by later calls, and dropped
whenever what it was decided from changes (tuning cache, plugins, steering environment, Doctor)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import PipelineConfig, ops
from tracea.doctor.doctor import get_doctor
from tracea.runtime import plans
from tracea.tuning.cache import TuningCache, set_cache


@pytest.fixture(autouse=True)
def _own_cache(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    plans.invalidate("test start")
    yield
    set_cache(None)
    plans.invalidate("test end")


def _ab(rng, m=12, k=9, n=7):
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def _builds() -> int:
    return plans.stats()["builds"]


def test_second_call_reuses_the_plan(rng):
    a, b = _ab(rng)
    ops.matmul(a, b)
    built = _builds()
    a2, b2 = _ab(rng)  # same signature, new data
    out = ops.matmul(a2, b2)
    assert _builds() == built
    np.testing.assert_allclose(out, a2.astype(np.float64) @ b2, rtol=1e-5, atol=1e-5)


def test_latest_plan_names_what_the_call_ran(rng):
    assert plans.latest() is None
    a, b = _ab(rng)
    ops.matmul(a, b)
    run = plans.latest().runner
    assert run.variant == get_doctor().decide(run.op, "cpu:0").variant.name
    ops.matmul(*_ab(rng, m=5))
    assert plans.latest().runner.op.m == 5


@pytest.mark.parametrize("change", ["shape", "dtype", "transposed", "activation", "bias", "out", "variant"])
def test_a_different_signature_builds_a_new_plan(rng, change):
    a, b = _ab(rng)
    ops.matmul(a, b)
    built = _builds()
    kw: dict = {}
    if change == "shape":
        a = rng.standard_normal((13, 9), dtype=np.float32)
    elif change == "dtype":
        a, b = a.astype(np.float64), b.astype(np.float64)
    elif change == "transposed":
        a = np.asfortranarray(a)
    elif change == "activation":
        kw["activation"] = "relu"
    elif change == "bias":
        kw["bias"] = rng.standard_normal(7, dtype=np.float32)
    elif change == "out":
        kw["out"] = np.empty((12, 7), np.float32)
    elif change == "variant":
        kw["variant"] = "reference.gemm"
    out = ops.matmul(a, b, **kw)
    assert _builds() == built + 1
    ref = a.astype(np.float64) @ b + (kw["bias"] if "bias" in kw else 0)
    if change == "activation":
        ref = np.maximum(ref, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_per_call_checks_still_run_on_a_cached_plan(rng):
    a, b = _ab(rng)
    out = np.empty((12, 7), np.float32)
    ops.matmul(a, b, out=out)
    from tracea.errors import InvalidArgumentError

    out.flags.writeable = False  # same signature, now read-only
    with pytest.raises(InvalidArgumentError, match="'out'"):
        ops.matmul(a, b, out=out)
    alias = np.empty((12, 9), np.float32)
    ops.matmul(alias, b, out=np.empty((12, 7), np.float32))
    with pytest.raises(InvalidArgumentError, match="overlap"):
        ops.matmul(alias, np.empty((9, 9), np.float32), out=alias)


def test_steering_environment_drops_plans(rng, monkeypatch):
    a, b = _ab(rng)
    ops.matmul(a, b)
    before = plans.stats()["invalidations"]
    monkeypatch.setenv("TRACEA_VARIANT", "reference.gemm")
    ops.matmul(a, b)
    assert plans.stats()["invalidations"] == before + 1
    assert plans.lookup(_key_of(a, b)).runner.variant == "reference.gemm"
    monkeypatch.delenv("TRACEA_VARIANT")
    ops.matmul(a, b)
    assert plans.lookup(_key_of(a, b)).runner.variant != "reference.gemm"


def _key_of(a, b):
    sig = plans.signature
    return ("matmul", sig(a), sig(b), None, None, None, None, None, None, None, None, plans.state(a))


def test_doctor_invalidate_and_reset_drop_plans(rng):
    a, b = _ab(rng)
    ops.matmul(a, b)
    assert plans.lookup(_key_of(a, b)) is not None
    get_doctor().invalidate()
    assert plans.lookup(_key_of(a, b)) is None
    ops.matmul(a, b)
    from tracea.doctor.doctor import reset_doctor

    reset_doctor()
    assert plans.lookup(_key_of(a, b)) is None


def test_a_tuning_cache_entry_drops_plans_and_is_used(rng):
    a, b = _ab(rng)
    ops.matmul(a, b)
    run = plans.lookup(_key_of(a, b)).runner
    decision = run.decision
    from tracea.tuning.cache import get_cache

    c = get_cache()
    entry = c.make_entry(decision.op, decision.chosen.variant, decision.profile, decision.chosen.config,
                         {"median_s": 1e-9})
    c.put(entry)
    assert plans.lookup(_key_of(a, b)) is None  # the next call decides again, with the entry as evidence
    ops.matmul(a, b)
    assert plans.lookup(_key_of(a, b)).runner.decision.chosen.source == "cache"


def test_plugin_change_drops_plans(rng):
    from tracea.plugins import set_plugin_manager

    a, b = _ab(rng)
    ops.matmul(a, b)
    set_plugin_manager(None)
    assert plans.lookup(_key_of(a, b)) is None


def test_unhashable_arguments_take_the_full_path_every_time(rng):
    a, b = _ab(rng)
    built = _builds()
    for _ in range(2):
        out = ops.matmul(a, b, epilogue=["relu"])  # a list: no signature
    assert _builds() == built
    np.testing.assert_allclose(out, np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-5, atol=1e-5)


def test_forced_config_is_part_of_the_signature(rng):
    a, b = _ab(rng)
    ops.matmul(a, b, variant="reference.gemm")
    built = _builds()
    ops.matmul(a, b, variant="reference.gemm", config=PipelineConfig(warps=1))
    assert _builds() == built + 1
