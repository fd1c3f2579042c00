"""The search loop shared by the AutoTuner and the tuner benchmark: seeds first, then the sampler,
pruning invalid configs before they are measured and scoring failures as failed trials."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace
from .goals import OptimizationGoal
from .measure import INVALID, Measurement
from .search import SpaceEncoding, dedupe, make_sampler, objective_value, quiet_optuna, resolve_sampler

#: consecutive proposals that are duplicates or invalid before a random unseen valid config is forced.
STALL_LIMIT = 8


@dataclass
class TrialRecord:
    """One trial: what was tried, where it came from, and how it scored (``score_s`` inf on failure)."""

    number: int
    variant: str
    config: PipelineConfig
    status: str
    score_s: float
    median_s: float = math.inf
    reason: str = ""
    source: str = "sampler"
    best_so_far_s: float = math.inf
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.score_s)

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "variant": self.variant, "config": self.config.key,
                "status": self.status, "score_s": None if not self.ok else self.score_s,
                "median_s": None if not math.isfinite(self.median_s) else self.median_s,
                "reason": self.reason, "source": self.source,
                "best_so_far_s": None if not math.isfinite(self.best_so_far_s) else self.best_so_far_s}


class Validator:
    """Memoised validity of configs: inside the space (constraints) and accepted by ``check``."""

    def __init__(self, space: SearchSpace, check: Callable[[PipelineConfig], str | None]) -> None:
        self.space, self.check = space, check
        self._memo: dict[str, str | None] = {}

    def reason(self, config: PipelineConfig) -> str | None:
        key = config.key
        if key not in self._memo:
            why = self.space.rejection(config)
            if why is None:
                try:
                    why = self.check(config)
                except Exception as exc:  # noqa: BLE001 - a broken validate_config is a pruned config
                    why = f"validate_config raised {type(exc).__name__}: {exc}"
            self._memo[key] = why
        return self._memo[key]


def search(space: SearchSpace, evaluate: Callable[[PipelineConfig], Measurement], *, variant: str,
           goal: OptimizationGoal, trials: int, validator: Validator,
           seeds: Sequence[tuple[PipelineConfig, str]] = (), sampler: str = "auto",
           seed: int | None = None, n_startup: int | None = None, deadline: float | None = None,
           on_trial: Callable[[TrialRecord], None] | None = None, start_number: int = 0,
           best_start: float = math.inf, local_every: int = 0, numeric_identity: bool = True,
           design: str = "maximin", additive: bool = False, stall_patience: int = 0) -> list[TrialRecord]:
    """Measure up to ``trials`` configs of ``space``; return every trial (pruned ones included).

    ``seeds`` (config, source) are measured first, in order. Spaces no larger than ``trials`` are
    measured exhaustively. ``deadline`` is a ``time.monotonic()`` value after which no trial starts.
    ``local_every``, ``numeric_identity``, ``design``, ``additive`` and ``stall_patience`` configure the
    candidate-set GP sampler (:mod:`tracea.tuning.candidates`); other samplers ignore them.
    """
    rng = random.Random(seed)
    records: list[TrialRecord] = []
    known: dict[str, float] = {}
    best = best_start
    measured = 0

    def record(config: PipelineConfig, m: Measurement | None, source: str, status: str = "",
               reason: str = "") -> float:
        nonlocal best, measured
        if m is not None:
            measured += 1
            score = m.score(goal)
            stats = m.stats if m.ok else {}
            status, reason = m.status, m.reason
        else:
            score, stats = math.inf, {}
        best = min(best, score)
        rec = TrialRecord(start_number + len(records), variant, config, status, score,
                          stats.get("median_s", math.inf), reason, source, best, stats)
        records.append(rec)
        if on_trial is not None:
            on_trial(rec)
        return score

    def out_of_budget() -> bool:
        return measured >= trials or (deadline is not None and time.monotonic() > deadline)

    small = space.cardinality <= max(trials, 1)
    queue = [(c, s) for c, s in dedupe_seeds(seeds)]
    if small:
        queue += [(c, "exhaustive") for c in space]
    for config, source in queue:
        if out_of_budget():
            return records
        if config.key in known:
            continue
        why = validator.reason(config)  # seeds outside the space's dims are still tried when valid
        if why is not None:
            known[config.key] = math.inf
            record(config, None, source, INVALID, why)
            continue
        known[config.key] = record(config, evaluate(config), source)
    if small:
        return records

    with quiet_optuna() as optuna:  # optuna's INFO lines and experimental warnings, for this search only
        enc = SpaceEncoding(space)
        dists = enc.distributions()
        kind = resolve_sampler(sampler)
        worst = [max((v for v in known.values() if math.isfinite(v)), default=math.inf)]

        def tell_failure(trial: Any) -> None:
            # optuna's GPSampler ignores failed trials, so it would propose the same invalid point again;
            # impute the worst score seen instead (as SMAC does for crashed configs). TPE copes with FAIL,
            # and the candidate-set sampler imputes by itself and never proposes a tried config.
            if kind == "optuna-gp" and math.isfinite(worst[0]):
                study.tell(trial, objective_value(worst[0]))
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if kind == "gp":
            from .candidates import DEFAULT_STARTUP, CandidatePool, make_candidate_sampler

            pool = CandidatePool(space, lambda c: validator.reason(c) is None, enc.encode, seed,
                                 numeric_identity=numeric_identity)
            opt_sampler = make_candidate_sampler(pool, dists, seed,
                                                 n_startup if n_startup is not None else DEFAULT_STARTUP,
                                                 local_every=local_every, design=design, additive=additive,
                                                 stall_patience=stall_patience)
        else:
            startup = n_startup if n_startup is not None else max(3, min(10, trials // 4))
            opt_sampler = make_sampler(kind, seed, startup)
        study = optuna.create_study(direction="minimize", sampler=opt_sampler)
        for (config, _src) in queue:  # teach the model what the seeds showed
            params = enc.encode(config)
            if params is None:
                continue
            value = known.get(config.key, math.inf)
            state = optuna.trial.TrialState.COMPLETE if math.isfinite(value) else optuna.trial.TrialState.FAIL
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, state=state,
                                                      value=objective_value(value) if math.isfinite(value) else None))
        stall = 0
        asks = 0
        while not out_of_budget() and asks < trials * 30 + 200:
            asks += 1
            forced = None
            if stall >= STALL_LIMIT:
                forced = _random_unseen(space, enc, known, validator, rng)
                if forced is None:
                    break  # every valid config has been measured
                study.enqueue_trial(enc.encode(forced))
                stall = 0
            trial = study.ask(dists)
            if getattr(opt_sampler, "exhausted", False):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break  # the candidate pool has no unmeasured valid config left
            config = enc.decode(trial.params)
            if config.key in known:
                value = known[config.key]
                if math.isfinite(value):
                    study.tell(trial, objective_value(value))
                else:
                    tell_failure(trial)
                stall += 1
                continue
            why = validator.reason(config)
            if why is not None:
                known[config.key] = math.inf
                tell_failure(trial)
                record(config, None, "sampler", INVALID, why)
                stall += 1
                continue
            stall = 0
            score = record(config, evaluate(config), "random" if forced is not None else "sampler")
            known[config.key] = score
            if math.isfinite(score):
                worst[0] = score if not math.isfinite(worst[0]) else max(worst[0], score)
                study.tell(trial, objective_value(score))
            else:
                tell_failure(trial)
        return records


def dedupe_seeds(seeds: Sequence[tuple[PipelineConfig, str]]) -> list[tuple[PipelineConfig, str]]:
    keys = {c.key for c in dedupe(c for c, _ in seeds)}
    out = []
    for c, s in seeds:
        if c.key in keys:
            keys.discard(c.key)
            out.append((c, s))
    return out


def _random_unseen(space: SearchSpace, enc: SpaceEncoding, known: dict[str, float], validator: Validator,
                   rng: random.Random, attempts: int = 2000) -> PipelineConfig | None:
    for _ in range(attempts):
        config = space.make({name: rng.choice(vals) for name, vals, _ in enc.dims})
        if config.key not in known and validator.reason(config) is None:
            return config
    rest = [c for c in space if c.key not in known and validator.reason(c) is None]
    return rng.choice(rest) if rest else None
