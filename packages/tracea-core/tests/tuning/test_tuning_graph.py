import math

import pytest

from tracea.ir import Conv2dOp, GemmOp
from tracea.tuning.graph import optimize_graph, shape_distance, split_budget

FAST = dict(progress=False, seed=2)


@pytest.fixture(autouse=True)
def _fast_measurement(monkeypatch):
    from tracea.tuning import autotuner

    orig = autotuner.AutoTuner.__init__

    def init(self, *a, **kw):
        kw.update(sampler="tpe", min_repeats=3, max_repeats=4, budget_s=0.005, warmup=1)
        orig(self, *a, **kw)

    monkeypatch.setattr(autotuner.AutoTuner, "__init__", init)


def test_split_budget_gives_everyone_one_and_the_rest_by_share():
    assert split_budget([0.7, 0.2, 0.1], 13) == [8, 3, 2]
    assert sum(split_budget([0.5, 0.3, 0.2], 17)) == 17
    assert split_budget([0.9, 0.1], 1) == [1, 1]  # every distinct op is at least verified


def test_shape_distance():
    a, b, c = GemmOp(64, 64, 64), GemmOp(128, 64, 64), GemmOp(512, 512, 512)
    assert shape_distance(a, a) == 0
    assert shape_distance(a, b) < shape_distance(a, c)
    assert shape_distance(a, Conv2dOp(1, 4, 8, 8, 4, 3, 3)) == math.inf


def test_identical_shapes_are_tuned_once_and_big_ops_first(doctor, cache):
    small, big = GemmOp(16, 16, 16), GemmOp(160, 160, 160)
    graph = [small, big, small, GemmOp(160, 160, 128), small]
    report = optimize_graph(graph, iterations=12, doctor=doctor, cache=cache, **FAST)
    keys = [e.op.key for e in report.entries]
    assert len(keys) == 3 and len(set(keys)) == 3
    by_key = {e.op.key: e for e in report.entries}
    assert by_key[small.key].nodes == [0, 2, 4]
    shares = [e.share for e in report.entries]
    assert shares == sorted(shares, reverse=True) and report.entries[0].op == big
    assert sum(e.budget for e in report.entries) == 12
    assert report.entries[0].budget > by_key[small.key].budget
    assert report.measured_trials <= 12
    for i in range(5):
        assert report.config_for(i) is not None
    assert "share" in report.table()


def test_similar_shapes_seed_the_search(doctor, cache):
    first, similar = GemmOp(96, 96, 96), GemmOp(96, 96, 80)
    optimize_graph([first], iterations=6, doctor=doctor, cache=cache, **FAST)
    report = optimize_graph([similar], iterations=4, doctor=doctor, cache=cache, **FAST)
    entry = report.entries[0]
    assert first.key in entry.seeded_from
    sources = [t.source for t in entry.result.history]
    assert "similar" in sources


def test_already_tuned_graph_costs_nothing(doctor, cache):
    graph = [GemmOp(32, 32, 32), Conv2dOp(1, 4, 8, 8, 4, 3, 3, padding=1)]
    optimize_graph(graph, iterations=6, doctor=doctor, cache=cache, goal="balanced", **FAST)
    again = optimize_graph(graph, iterations=6, doctor=doctor, cache=cache, goal="balanced", **FAST)
    assert again.measured_trials == 0
    assert all(e.result.from_cache for e in again.entries)
