import math

import pytest

from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace
from tracea.tuning.goals import OptimizationGoal
from tracea.tuning.loop import Validator, search
from tracea.tuning.measure import Measurement
from tracea.tuning.search import SpaceEncoding

SPACE = (SearchSpace().tile_m([16, 32, 64, 128]).tile_n([16, 32, 64, 128]).tile_k([8, 16, 32])
         .warps([1]).swizzles(["none", "xor4"]).where(lambda c: c.tile_m * c.tile_n <= 8192))


def synthetic(config):
    t = (abs(math.log2(config.tile_m) - 6) + abs(math.log2(config.tile_n) - 5) + abs(math.log2(config.tile_k) - 4)
         + (0.3 if config.swizzle.value == "none" else 0.0) + 1.0) * 1e-4
    return Measurement(config, times=[t, t * 1.01, t * 0.99])


def test_encoding_round_trips_every_config():
    enc = SpaceEncoding(SPACE)
    for c in SPACE:
        assert enc.decode(enc.encode(c)) == c
    assert enc.encode(PipelineConfig(tile_m=48)) is None


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_search_prunes_invalid_never_repeats_and_respects_budget(sampler):
    evaluated = []

    def evaluate(c):
        evaluated.append(c.key)
        return synthetic(c)

    validator = Validator(SPACE, lambda c: "too big" if c.tile_k == 32 and c.tile_m == 128 else None)
    recs = search(SPACE, evaluate, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=15,
                  validator=validator, sampler=sampler, seed=0,
                  seeds=[(PipelineConfig(tile_m=256, tile_n=256, warps=1), "hero")])
    assert len(evaluated) == 15 and len(set(evaluated)) == 15
    assert not any(c.startswith("tm128") and ".tk32." in c for c in evaluated)
    assert recs[0].source == "hero" and recs[0].status == "invalid"  # violates the where() constraint
    assert all(r.status == "invalid" for r in recs if r.config.key not in evaluated)
    best = [r.best_so_far_s for r in recs]
    assert best == sorted(best, reverse=True)


def test_small_space_is_measured_exhaustively():
    small = SearchSpace().tile_m([16, 32]).tile_n([16]).warps([1])
    recs = search(small, synthetic, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=10,
                  validator=Validator(small, lambda c: None))
    assert [r.source for r in recs] == ["exhaustive", "exhaustive"]


def test_search_stops_when_every_valid_config_is_known():
    tiny = SearchSpace().tile_m([16, 32, 64]).tile_n([16, 32, 64]).warps([1])
    recs = search(tiny, synthetic, variant="v", goal=OptimizationGoal.MaximizeTFLOPS, trials=8, sampler="tpe",
                  validator=Validator(tiny, lambda c: None if c.tile_m == 16 else "no"), seed=1)
    assert sum(1 for r in recs if r.status == "ok") == 3


def test_convergence_plot_writes_png(doctor, cache, tmp_path):
    pytest.importorskip("matplotlib")
    from tracea.ir import GemmOp
    from tracea.tuning.autotuner import AutoTuner

    res = AutoTuner(doctor=doctor, trials=5, cache=cache, progress=False, sampler="random", seed=0,
                    min_repeats=3, max_repeats=3, budget_s=0.001).tune(GemmOp(24, 24, 24))
    path = res.plot(str(tmp_path / "conv.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(res.convergence()) == res.measured_trials


class _Tty:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_bar_on_a_terminal_and_silence_elsewhere():
    import io

    from tracea.tuning.progress import Progress

    tty = _Tty()
    with Progress(2, "tune x", stream=tty) as p:
        p.update(math.inf, "compile_error")
        p.update(2e-5, "ok", flops=1e6)
    assert "tune x" in tty.text and "2/2" in tty.text and "best 20.0 us (50 GFLOP/s) ok" in tty.text
    pipe = io.StringIO()
    with Progress(2, "tune x", stream=pipe) as p:
        p.update(1.0)
    assert pipe.getvalue() == "" and p.n == 1
    quiet = _Tty()
    with Progress(2, "tune x", stream=quiet, enabled=False) as p:
        p.update(1.0)
    assert quiet.text == ""
