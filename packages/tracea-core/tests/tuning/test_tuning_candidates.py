"""The candidate-set GP sampler (tracea.tuning.candidates, tracea.tuning.gp)."""

import math

import numpy as np
import pytest

from tracea.errors import InvalidArgumentError
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace
from tracea.tuning.goals import OptimizationGoal
from tracea.tuning.loop import Validator, search
from tracea.tuning.measure import Measurement
from tracea.tuning.search import SpaceEncoding, resolve_sampler

pytest.importorskip("scipy")

SPACE = (SearchSpace().tile_m([16, 32, 64, 128]).tile_n([16, 32, 64, 128]).tile_k([8, 16, 32])
         .warps([1]).swizzles(["none", "xor4"]).where(lambda c: c.tile_m * c.tile_n <= 8192))
BIG = (SearchSpace().tile_m([16, 32, 64, 128, 256, 512]).tile_n([16, 32, 64, 128, 256, 512])
       .tile_k([8, 16, 32, 64, 128]).stages([1, 2, 3]).warps([1]).param("order", ["a", "b", "c"]))


def synthetic(config):
    t = (abs(math.log2(config.tile_m) - 6) + abs(math.log2(config.tile_n) - 5) + abs(math.log2(config.tile_k) - 4)
         + (0.3 if config.swizzle.value == "none" else 0.0) + 1.0) * 1e-4
    return Measurement(config, times=[t, t * 1.01, t * 0.99])


def bumpy(config):
    """A smooth bowl in log2 tile sizes with interactions and a categorical effect; optimum unique."""
    lm, ln, lk = math.log2(config.tile_m), math.log2(config.tile_n), math.log2(config.tile_k)
    t = 1.0 + 0.3 * (lm - 7) ** 2 + 0.2 * (ln - 6) ** 2 + 0.1 * (lk - 5) ** 2 + 0.15 * (lm - ln - 1) ** 2
    t += {"a": 0.4, "b": 0.0, "c": 0.8}[config.get("order")] + 0.2 * abs(config.stages - 2)
    return Measurement(config, times=[t * 1e-4] * 3)


def run(space, evaluate, trials, seed, validator=None, seeds=()):
    validator = validator or Validator(space, lambda c: None)
    return search(space, evaluate, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=trials,
                  validator=validator, sampler="gp", seed=seed, seeds=seeds)


def test_never_proposes_an_invalid_or_measured_config():
    evaluated = []

    def evaluate(c):
        evaluated.append(c)
        return synthetic(c)

    validator = Validator(SPACE, lambda c: "too big" if c.tile_k == 32 and c.tile_m == 128 else None)
    recs = run(SPACE, evaluate, 20, 0, validator, seeds=[(PipelineConfig(tile_m=256, tile_n=256, warps=1), "hero")])
    assert len(evaluated) == 20 and len({c.key for c in evaluated}) == 20
    assert all(validator.reason(c) is None for c in evaluated)
    # the only invalid record is the hero outside the space: the sampler itself proposed none
    assert [r.source for r in recs if r.status == "invalid"] == ["hero"]
    assert not any(r.config.tile_m == 128 and r.config.tile_k == 32 for r in recs if r.status == "ok")


def test_deterministic_for_a_fixed_seed_and_varies_with_it():
    a = [r.config.key for r in run(BIG, bumpy, 12, 7)]
    b = [r.config.key for r in run(BIG, bumpy, 12, 7)]
    c = [r.config.key for r in run(BIG, bumpy, 12, 8)]
    assert a == b and a != c


def test_stops_when_every_valid_config_is_measured():
    tiny = SearchSpace().tile_m([16, 32, 64]).tile_n([16, 32, 64]).warps([1])
    recs = run(tiny, synthetic, 8, 1, Validator(tiny, lambda c: None if c.tile_m == 16 else "no"))
    assert [r.status for r in recs] == ["ok"] * 3


def test_failed_configs_are_not_retried_and_the_search_goes_on():
    calls = []

    def flaky(c):
        calls.append(c.key)
        if c.tile_m == 512:
            return Measurement(c, status="compile_error", reason="too many registers")
        return bumpy(c)

    recs = run(BIG, flaky, 25, 3)
    assert len(calls) == 25 and len(set(calls)) == 25
    assert min(r.score_s for r in recs) < math.inf


def test_beats_random_search_on_a_structured_space():
    """Median trials to reach the unique optimum of 1620 configs; random search needs ~810."""
    target = min(bumpy(c).score(OptimizationGoal.MaximizeTFLOPS) for c in BIG)
    needed = []
    for seed in range(3):
        recs = run(BIG, bumpy, 35, seed)
        ok = [r for r in recs if r.status == "ok"]
        needed.append(next((i for i, r in enumerate(ok, 1) if r.score_s <= target * 1.0001), math.inf))
    assert sorted(needed)[1] <= 35, needed


def test_pool_features_log2_scaled_and_one_hot():
    from tracea.tuning.candidates import CandidatePool

    space = SearchSpace().tile_m([16, 64, 256]).warps([4]).param("kind", ["x", "y", "z"]).param("flag", [True, False])
    pool = CandidatePool(space, lambda c: True, SpaceEncoding(space).encode)
    assert len(pool) == 18 and pool.features.shape == (18, 1 + 3 + 1)  # warps has one value: dropped
    row = pool.features[[i for i, c in enumerate(pool.configs)
                         if c.tile_m == 64 and c.get("kind") == "y" and c.get("flag") is True][0]]
    assert row[0] == pytest.approx(0.5) and list(row[1:4]) == [0.0, 1.0, 0.0]
    assert pool.lookup(SpaceEncoding(space).encode(pool.configs[5])) == 5


def test_gp_gradient_and_fit():
    from tracea.tuning.gp import GaussianProcess, _neg_log_posterior, _pairwise, expected_improvement

    rng = np.random.default_rng(0)
    x = rng.random((25, 3))
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2
    theta = rng.normal(size=6) * 0.3
    xc = np.c_[x, rng.integers(0, 3, 25)]  # plus an identity (categorical) column
    pair = _pairwise(xc, np.array([False, False, False, True]))
    f, g = _neg_log_posterior(theta, pair, (y - y.mean()) / y.std())
    eye = np.eye(6) * 1e-6
    num = [(_neg_log_posterior(theta + e, pair, (y - y.mean()) / y.std())[0]
            - _neg_log_posterior(theta - e, pair, (y - y.mean()) / y.std())[0]) / 2e-6 for e in eye]
    assert np.allclose(g, num, rtol=1e-4, atol=1e-5)
    gp = GaussianProcess().fit(x, y)
    xq = rng.random((50, 3))
    mean, std = gp.predict(xq)
    assert np.abs(mean - (np.sin(3 * xq[:, 0]) + xq[:, 1] ** 2)).mean() < 0.1 and (std > 0).all()
    ei = expected_improvement(np.array([0.0, 0.0, 5.0, -1.0]), np.array([1.0, 0.1, 0.1, 0.1]), 0.0)
    assert ei[0] > ei[1] > ei[2] and ei[3] > ei[0] and np.isfinite(ei).all()


def test_sampler_names():
    assert resolve_sampler("auto") == "gp"
    with pytest.raises(InvalidArgumentError):
        resolve_sampler("simulated-annealing")


def test_huge_space_is_represented_by_a_sample_of_valid_configs(monkeypatch):
    from tracea.tuning import candidates

    monkeypatch.setattr(candidates, "ENUMERATE_LIMIT", 100)
    monkeypatch.setattr(candidates, "SAMPLE_SIZE", 200)
    validator = Validator(BIG, lambda c: None if c.stages != 3 else "no stage 3")
    pool = candidates.CandidatePool(BIG, lambda c: validator.reason(c) is None, SpaceEncoding(BIG).encode, seed=0)
    assert len(pool) == 200 and len({c.key for c in pool.configs}) == 200
    assert all(c.stages != 3 for c in pool.configs)
    recs = run(BIG, bumpy, 10, 0, validator)
    assert all(r.status == "ok" for r in recs) and len({r.config.key for r in recs}) == 10


def test_auto_falls_back_to_tpe_without_scipy(monkeypatch):
    from tracea.tuning import candidates

    monkeypatch.setattr(candidates, "available", lambda: False)
    assert resolve_sampler("auto") == "tpe"
    recs = search(SPACE, synthetic, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=6,
                  validator=Validator(SPACE, lambda c: None), sampler="auto", seed=0)
    assert sum(1 for r in recs if r.status == "ok") == 6


def test_pool_steps_count_sorted_value_steps_and_category_changes():
    from tracea.tuning.candidates import CandidatePool

    space = SearchSpace().tile_m([64, 16, 32]).tile_n([16, 32]).warps([1]).param("kind", ["x", "y", "z"])
    pool = CandidatePool(space, lambda c: True, SpaceEncoding(space).encode)
    idx = {(c.tile_m, c.tile_n, c.get("kind")): i for i, c in enumerate(pool.configs)}
    others = [idx[(32, 16, "x")], idx[(64, 16, "x")], idx[(64, 32, "z")], idx[(16, 16, "x")]]
    # tile_m's values are listed out of order: steps follow the sorted order 16 < 32 < 64
    assert pool.steps(idx[(16, 16, "x")], np.array(others)).tolist() == [1.0, 2.0, 4.0, 0.0]


def test_local_steps_stay_next_to_the_best_config_so_far():
    from tracea.tuning import candidates

    picks = []
    orig = candidates.CandidateGPSampler.propose

    def spy(self, trials, exclude=None):
        best = min((t for t in trials if t.number != exclude and t.value is not None), key=lambda t: t.value,
                   default=None)
        idx = orig(self, trials, exclude)
        if self.last_pick == "local":
            picks.append(float(self.pool.steps(self.pool.lookup(best.params), np.array([idx]))[0]))
        return idx

    candidates.CandidateGPSampler.propose = spy
    try:
        recs = search(BIG, bumpy, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=24,
                      validator=Validator(BIG, lambda c: None), sampler="gp", seed=0, local_every=2)
    finally:
        candidates.CandidateGPSampler.propose = orig
    assert len(recs) == 24 and len(picks) >= 8  # (24 - 6 startup) / 2 model proposals are local
    assert all(1 <= d <= candidates.LOCAL_RADIUS for d in picks), picks


def test_failure_model_steers_away_from_a_failing_region():
    """A sixth of BIG fails (tile_m 512); after the first failures the sampler should rarely go back."""
    failed = []

    def flaky(c):
        if c.tile_m == 512:
            failed.append(c.key)
            return Measurement(c, status="compile_error", reason="too many registers")
        return bumpy(c)

    for seed in range(3):
        failed.clear()
        recs = run(BIG, flaky, 40, seed)
        model_fails = [r for r in recs[6:] if r.status != "ok"]
        assert len(recs) == 40 and len(model_fails) <= 3, (seed, len(model_fails))
