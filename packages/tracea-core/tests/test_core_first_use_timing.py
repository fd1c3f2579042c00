"""First-use tuning's candidates and timing, on made-up variants and a simulated asynchronous device (a
clock the launches advance), so every outcome is exact: which configs are timed, that a sample is a batch
of back-to-back calls (what eager callers pay: the kernel, or the launch where that is longer), that a
challenger must be clearly faster than the default choice, and that compiling stops at its budget."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import GemmOp
from tracea.doctor.decision import Candidate, Decision
from tracea.doctor.doctor import get_doctor
from tracea.doctor.variant import KernelVariant
from tracea.runtime import first_use, plans
from tracea.semantic.config import PipelineConfig
from tracea.tuning.cache import TuningCache, get_cache, set_cache


def _cfg(i: int) -> PipelineConfig:
    return PipelineConfig(tile_m=16 * (i + 1), tile_n=16, tile_k=16, stages=1, warps=1)


class _Made(KernelVariant):
    """A made-up CPU GEMM variant with ``heroes`` hero configs."""

    backend = "madeup"

    def __init__(self, name: str, heroes: int) -> None:
        self.name = name
        self._heroes = [_cfg(i) for i in range(heroes)]

    def hero_configs(self, op, profile):  # noqa: ANN001, ANN201
        return list(self._heroes)


class _Device:
    """Host clock and device queue: a launch costs ``host`` seconds of the clock and queues ``device``
    seconds of work behind what is queued; a synchronization waits for the queue."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_until = 0.0

    def clock(self) -> float:
        return self.now

    def sync(self) -> None:
        self.now = max(self.now, self.busy_until)

    def launch(self, host: float, device: float) -> None:
        self.now += host
        self.busy_until = max(self.now, self.busy_until) + device


class _Adapter:
    def to_host(self, out):  # noqa: ANN001, ANN201
        return out


@pytest.fixture(autouse=True)
def _own_cache(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    plans.invalidate("test")
    yield
    set_cache(None)


def _decision(*cands: tuple[_Made, float]) -> Decision:
    op = GemmOp(8, 8, 8)
    profile = get_doctor().profile_for("cpu")
    return Decision(op, profile.device, profile,
                    [Candidate(v, v._heroes[0], "hero", est) for v, est in cands])


def _tune(decision: Decision, costs: dict[tuple[str, int], tuple[float, float]], dev: _Device,
          bind_s: float = 0.0) -> tuple[str, int]:
    """Tune with launchers of the given (host, device) seconds per (variant, hero index); the winner."""
    bound = []

    def bind(variant, cfg):  # noqa: ANN001, ANN202
        dev.now += bind_s  # compiling takes the host's time
        host, device = costs[(variant.name, variant._heroes.index(cfg))]
        bound.append((variant.name, cfg))

        def launch(a, out, host=host, device=device):  # noqa: ANN001, ANN202
            dev.launch(host, device)
            out[...] = a
        return launch

    a, out = np.ones(4), np.zeros(4)
    assert first_use.tune(decision, (a,), out, _Adapter(), bind, clock=dev.clock, sync=dev.sync)
    (entry,) = get_cache().entries()
    variant = next(c.variant for c in decision.candidates if c.variant.name == entry.variant)
    _tune.bound = bound  # type: ignore[attr-defined]
    return entry.variant, [c.key for c in variant._heroes].index(entry.config.key)


def test_candidates_are_the_chosen_variants_heroes_then_variants_estimated_close():
    chosen, close, far = _Made("made.a", 5), _Made("made.b", 4), _Made("made.c", 3)
    decision = _decision((chosen, 1e-5), (close, 2e-5), (far, first_use.ESTIMATE_SPAN * 1e-5 * 1.01))
    trials = [(v.name, v._heroes.index(c)) for v, c in first_use._trials(decision)]
    assert trials[:first_use.HEROES_CHOSEN] == [("made.a", i) for i in range(first_use.HEROES_CHOSEN)]
    assert trials[first_use.HEROES_CHOSEN:] == [("made.b", i) for i in range(first_use.HEROES_PER_VARIANT)]
    assert all(name != "made.c" for name, _ in trials)  # estimated too slow: not worth its compilation
    assert first_use.alternatives(decision, 2) == [(chosen, chosen._heroes[1]), (chosen, chosen._heroes[2])]


def test_unusable_estimates_do_not_drop_variants():
    chosen, other = _Made("made.a", 1), _Made("made.b", 1)
    decision = _decision((chosen, float("nan")), (other, 1.0))
    assert [v.name for v, _ in first_use._trials(decision)] == ["made.a", "made.b"]
    assert len(first_use.alternatives(decision)) == 1


def test_samples_are_back_to_back_calls_not_one_launch():
    # the default: a 2 us launch of 20 us of kernel; the other: a 21 us launch of 0.5 us of kernel. One
    # synchronized launch each takes 22 vs 21.5 us, but back to back (what a caller's eager calls cost)
    # they cost 20 vs 21 us a call: the default is faster
    a, b = _Made("made.a", 1), _Made("made.b", 1)
    costs = {("made.a", 0): (2e-6, 20e-6), ("made.b", 0): (21e-6, 0.5e-6)}
    assert _tune(_decision((a, 1e-5), (b, 1e-5)), costs, _Device()) == ("made.a", 0)


def test_a_challenger_must_be_clearly_faster_than_the_default(tmp_path):
    a = _Made("made.a", 3)
    slightly = {("made.a", 0): (1e-6, 20e-6), ("made.a", 1): (1e-6, 19.8e-6), ("made.a", 2): (1e-6, 30e-6)}
    assert _tune(_decision((a, 1e-5)), slightly, _Device()) == ("made.a", 0)
    set_cache(TuningCache(tmp_path / "b.json"))
    clearly = dict(slightly)
    clearly[("made.a", 1)] = (1e-6, 15e-6)
    assert _tune(_decision((a, 1e-5)), clearly, _Device()) == ("made.a", 1)


def test_compiling_stops_at_its_budget(tmp_path):
    a = _Made("made.a", 3)
    b = _Made("made.b", 2)
    costs = {(n, i): (1e-6, 10e-6 * (i + 1)) for n in ("made.a", "made.b") for i in range(3)}
    dev = _Device()
    per_bind = first_use.COMPILE_BUDGET_S * 0.6
    _tune(_decision((a, 1e-5), (b, 1e-5)), costs, dev, bind_s=per_bind)
    assert len(_tune.bound) == 2  # type: ignore[attr-defined]  # two at least, then the budget was spent
    set_cache(TuningCache(tmp_path / "c.json"))
    _tune(_decision((a, 1e-5), (b, 1e-5)), costs, _Device(), bind_s=0.0)
    assert len(_tune.bound) == 5  # type: ignore[attr-defined]
