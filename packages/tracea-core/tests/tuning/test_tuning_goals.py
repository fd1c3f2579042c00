import math

import pytest

from tracea.errors import InvalidArgumentError
from tracea.tuning.goals import OptimizationGoal, percentile, time_stats


def test_parse_accepts_names_values_and_aliases():
    G = OptimizationGoal
    assert G.parse("MinimizeLatency") is G.MinimizeLatency
    assert G.parse("min_latency") is G.MINIMIZE_LATENCY
    assert G.parse("balanced") is G.Balanced
    assert G.parse(None) is G.MaximizeTFLOPS
    with pytest.raises(InvalidArgumentError, match="goal"):
        G.parse("fastest")


def test_scores_follow_their_definitions():
    times = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert OptimizationGoal.MaximizeTFLOPS.score(times) == 1.0
    assert OptimizationGoal.MinimizeLatency.score(times) == pytest.approx(percentile(sorted(times), 0.9))
    assert OptimizationGoal.MinimizeLatency.score(times) > 1.0
    st = time_stats(times)
    assert OptimizationGoal.Balanced.score(times) == pytest.approx(1.0 * (1 + 0.5 * st["cv"]))
    assert OptimizationGoal.MaximizeTFLOPS.score([]) == math.inf


def test_goals_rank_fast_erratic_against_slower_steady_differently():
    erratic = [1.0] * 6 + [4.0] * 4        # median 1.0 but a heavy tail
    steady = [1.3] * 10
    G = OptimizationGoal
    assert G.MaximizeTFLOPS.score(erratic) < G.MaximizeTFLOPS.score(steady)
    assert G.MinimizeLatency.score(erratic) > G.MinimizeLatency.score(steady)
    assert G.Balanced.score(erratic) > G.Balanced.score(steady)
