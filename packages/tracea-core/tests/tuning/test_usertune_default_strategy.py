"""tune_kernel's default strategy (tracea.usertune.strategies "tracea"): the candidate-set GP sampler with
the value-covering start, the additive GP kernel, local steps and the pair-covering stall rule."""

import math

import numpy as np
import pytest

from tracea.errors import InvalidArgumentError
from tracea.usertune import strategies
from tracea.usertune.space import build_space, check_tune_params, compile_restrictions

pytest.importorskip("scipy")

BSN = ["block_size_x", "block_size_y", "block_size_z"]
PARAMS = {"block_x": [32, 64, 128, 256, 512], "block_y": [1, 2, 4, 8, 16, 32], "tile_x": [1, 2, 4, 8, 16],
          "unroll": [0, 1]}


def make_space(params=PARAMS, restrictions=("tile_x <= block_x",)):
    checked = check_tune_params(params)
    names = list(checked)
    return build_space(checked, compile_restrictions(list(restrictions), names), BSN, 1024), names


def sweet_spot(p):
    """Fast only at an inner value of one parameter and one value of another (like a C conv's tile 2,
    no unroll), flat in the rest; a small deterministic ripple so that no two configs tie."""
    t = 1.0 + 0.25 * abs(math.log2(p["tile_x"]) - 1) + 0.3 * p["unroll"]
    return t * (1.0 + 0.002 * ((p["block_x"] * 7 + p["block_y"] * 13) % 11))


def drive(evaluate, budget=40, seed=0, space_names=None):
    space, names = space_names or make_space()
    calls = []

    def record(p):
        calls.append(dict(p))
        return evaluate(p)

    n = strategies.run(*strategies.resolve(None, {"max_fevals": budget}), space, names, record, seed)
    return n, calls, space, names


def test_deterministic_for_a_seed_and_varies_with_it():
    a = [tuple(p.values()) for p in drive(sweet_spot, 15, seed=5)[1]]
    b = [tuple(p.values()) for p in drive(sweet_spot, 15, seed=5)[1]]
    c = [tuple(p.values()) for p in drive(sweet_spot, 15, seed=6)[1]]
    assert a == b and a != c


def test_respects_restrictions_and_never_evaluates_a_config_twice():
    space_names = make_space(restrictions=("tile_x <= block_y * 4", "block_x * block_y <= 2048"))
    n, calls, space, _ = drive(sweet_spot, 40, space_names=space_names)
    keys = [tuple(p.values()) for p in calls]
    assert n == 40 == len(keys) == len(set(keys))
    assert all(p["tile_x"] <= p["block_y"] * 4 and p["block_x"] * p["block_y"] <= 2048 for p in calls)


def test_finds_an_inner_sweet_spot_quickly():
    """The value-covering start tries tile_x = 2 early and the additive model combines it with unroll = 0
    (a maximin start tries the corners tile_x = 1 and 16 first)."""
    best = min(sweet_spot(p) for p in ({"block_x": bx, "block_y": by, "tile_x": 2, "unroll": 0}
                                       for bx in PARAMS["block_x"] for by in PARAMS["block_y"]))
    class Found(Exception):
        pass

    def until_found(p):
        t = sweet_spot(p)
        if t <= best * 1.03:
            raise Found()
        return t

    needed = []
    for seed in range(5):
        calls = []
        with pytest.raises(Found):
            drive(lambda p, calls=calls: calls.append(p) or until_found(p), 30, seed=seed)
        needed.append(len(calls))
    assert sorted(needed)[2] <= 10, needed


def test_start_design_covers_every_value_of_every_parameter():
    unrestricted = make_space(restrictions=())
    calls = drive(sweet_spot, 6, space_names=unrestricted)[1]
    for name, values in PARAMS.items():
        assert {p[name] for p in calls} == set(values), name


def test_failing_configs_are_avoided_and_not_retried():
    def fails_big(p):
        return math.inf if p["block_x"] * p["block_y"] > 1024 else sweet_spot(p)

    n, calls, _, _ = drive(fails_big, 40)
    keys = [tuple(p.values()) for p in calls]
    assert len(keys) == len(set(keys)) == 40
    assert any(math.isfinite(fails_big(p)) for p in calls)
    later = calls[20:]  # once the failure model has data, most proposals run
    assert sum(math.isfinite(fails_big(p)) for p in later) > len(later) / 2


def test_all_failing_space_evaluates_each_config_once_up_to_the_budget():
    space_names = make_space(params={"a": [1, 2, 4], "b": [8, 16, 32, 64], "c": [0, 1]}, restrictions=())
    n, calls, _, _ = drive(lambda p: math.inf, 15, space_names=space_names)
    assert n == 15 == len({tuple(p.values()) for p in calls})
    n, calls, _, _ = drive(lambda p: math.inf, 100, space_names=space_names)  # budget over the space: all 24
    assert n == 24 == len({tuple(p.values()) for p in calls})


def test_a_space_with_no_valid_config_is_a_clear_error():
    space_names = make_space(restrictions=("block_x > 4096",))
    with pytest.raises(InvalidArgumentError, match="restrictions"):
        drive(sweet_spot, 10, space_names=space_names)


def test_stall_rule_tries_untried_value_pairs():
    """After STALL_PATIENCE evaluations without a better config the non-local proposals cover value pairs."""
    from tracea.tuning import candidates

    picks = []
    orig = candidates.CandidateGPSampler.propose

    def spy(self, *a, **k):
        out = orig(self, *a, **k)
        picks.append(self.last_pick)
        return out

    first = {}

    def plateau(p):  # the first config stays the best: nothing ever improves on it
        key = tuple(p.values())
        first.setdefault("key", key)
        return 1.0 if key == first["key"] else 2.0 + 0.01 * (hash(key) % 7)

    candidates.CandidateGPSampler.propose = spy
    try:
        drive(plateau, 30)
    finally:
        candidates.CandidateGPSampler.propose = orig
    assert "pairs" in picks and "pairs" not in picks[:strategies.STALL_PATIENCE]


def test_pair_cover_counts_and_since_improvement():
    from tracea.semantic.search_space import SearchSpace
    from tracea.tuning.candidates import CandidatePool, _since_improvement, make_candidate_sampler
    from tracea.tuning.search import SpaceEncoding

    space = SearchSpace().param("a", [1, 2]).param("b", [1, 2]).param("c", [1, 2])
    enc = SpaceEncoding(space)
    pool = CandidatePool(space, lambda c: True, enc.encode)
    sampler = make_candidate_sampler(pool, enc.distributions(), 0)
    idx = {tuple(c.get(n) for n in "abc"): i for i, c in enumerate(pool.configs)}
    tried = [idx[(1, 1, 1)]]
    free = np.array([idx[(1, 1, 2)], idx[(2, 2, 2)], idx[(1, 2, 1)]])
    assert sampler._pair_cover_counts(free, tried).tolist() == [2.0, 3.0, 2.0]  # (1, 2, 1): a-b and b-c new, a-c seen
    assert _since_improvement([3.0, None, 2.0, 2.5, None]) == 2
    assert _since_improvement([1.0, 2.0, 3.0]) == 2


def test_additive_gp_gradient_and_prediction():
    from tracea.tuning.gp import GaussianProcess, _neg_log_posterior, _pairwise, describe

    rng = np.random.default_rng(1)
    x = np.c_[rng.random((30, 2)), rng.integers(0, 3, 30)]
    kinds = np.array([False, False, True])
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.5 * (x[:, 2] == 1)
    ys = (y - y.mean()) / y.std()
    pair = _pairwise(x, kinds)
    theta = rng.normal(size=8) * 0.3
    f, g = _neg_log_posterior(theta, pair, ys, True)
    num = [(_neg_log_posterior(theta + e, pair, ys, True)[0] - _neg_log_posterior(theta - e, pair, ys, True)[0]) / 2e-6
           for e in np.eye(8) * 1e-6]
    assert np.allclose(g, num, rtol=1e-4, atol=1e-5)
    gp = GaussianProcess(additive=True).fit(x, y, kinds)
    xq = np.c_[rng.random((40, 2)), rng.integers(0, 3, 40)]
    mean, std = gp.predict(xq)
    truth = np.sin(3 * xq[:, 0]) + xq[:, 1] ** 2 + 0.5 * (xq[:, 2] == 1)
    assert np.abs(mean - truth).mean() < 0.1 and (std > 0).all()
    assert len(describe(gp)["additive_var"]) == 3
