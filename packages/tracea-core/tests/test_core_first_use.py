"""Tuning on first use (tracea.set_tuning / TRACEA_TUNING): the first call of an untuned signature times its
top candidates and persists the fastest; later calls and processes run it; default off."""

from __future__ import annotations

import numpy as np
import pytest

import tracea
from tracea import GemmOp, ops
from tracea.doctor.doctor import get_doctor
from tracea.runtime import plans
from tracea.tuning.cache import TuningCache, get_cache, set_cache


@pytest.fixture(autouse=True)
def _own_cache(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    plans.invalidate("test")
    yield
    tracea.set_tuning(None)
    set_cache(None)


def _ab(rng, m=64, k=48, n=80):
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def test_default_is_off(rng, monkeypatch):
    monkeypatch.delenv("TRACEA_TUNING", raising=False)
    assert tracea.tuning_mode() == "off"
    a, b = _ab(rng)
    ops.matmul(a, b)
    assert len(get_cache()) == 0


def test_first_use_persists_a_measured_winner(rng):
    tracea.set_tuning("first-use")
    a, b = _ab(rng)
    out = ops.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    entries = get_cache().entries()
    assert len(entries) == 1 and entries[0].median_s > 0 and entries[0].trials >= 2
    assert entries[0].default_s > 0  # the winner's default config (its first hero) was among the timed
    decision = get_doctor().decide(GemmOp(64, 80, 48), "cpu")
    assert decision.chosen.source == "cache" and decision.chosen.variant.name == entries[0].variant
    built = plans.stats()["builds"]
    out = ops.matmul(*_ab(rng))  # tuned now: no second tuning, the plan is reused
    assert len(get_cache().entries()) == 1 and plans.stats()["builds"] == built


def test_environment_switch_and_bad_mode(rng, monkeypatch):
    monkeypatch.setenv("TRACEA_TUNING", "first-use")
    assert tracea.tuning_mode() == "first-use"
    ops.matmul(*_ab(rng, 33, 17, 29))
    assert len(get_cache()) == 1
    with pytest.raises(tracea.InvalidArgumentError):
        tracea.set_tuning("always")


def test_alternatives_are_the_other_candidates_in_the_doctors_order():
    from tracea.runtime import first_use

    decision = get_doctor().decide(GemmOp(64, 80, 48), "cpu")
    alts = first_use.alternatives(decision, 4)
    assert 1 <= len(alts) <= 4
    chosen = (decision.chosen.variant, decision.chosen.config)
    assert chosen not in alts and len(set((v.name, c.key) for v, c in alts)) == len(alts)
    assert not any(v.fallback_only for v, _ in alts)
    assert first_use.alternatives(decision, 1) == alts[:1]
