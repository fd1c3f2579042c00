"""Candidate-set Bayesian optimisation: the tuner's default sampler.

A variant's search space is finite. :class:`CandidatePool` enumerates its *valid* configs once (the
space's constraints and ``validate_config``), so the sampler can only ever propose a valid config
that has not been tried: invalid points neither cost a trial nor need an imputed score that would
distort the model. :class:`CandidateGPSampler` is an optuna sampler (``BaseSampler``):

1. **Start**: until ``n_startup`` configs have results (seeds such as hero configs count), it picks a
   space-filling design over the pool: each pick is the unmeasured valid config farthest (maximin, in
   feature space) from everything already tried, the first one at random.
2. **Model**: a Gaussian process (:mod:`tracea.tuning.gp`: Matern 5/2, one length scale per feature,
   fitted noise) on the study's *successful* trials, objective ``log(score)``. Failed trials (compile
   error, too many resources, wrong result ...) are modelled apart: a second GP on the failure
   indicator (1 failed, 0 ran) gives each candidate a probability of failing, and the acquisition is
   multiplied by the probability of running (constrained BO), so regions that fail are avoided without
   distorting the time model with made-up scores.
3. **Acquisition**: expected improvement evaluated on *every* unmeasured valid config of the pool;
   the best one is proposed (ties broken at random). No continuous relaxation, no rounding.
4. **Local steps** (``local_every``; the user-kernel strategy turns them on, see
   :mod:`tracea.usertune.strategies`): every ``local_every``-th model proposal is restricted to the unmeasured configs
   nearest the incumbent (the best config so far): those one step away, else two (a step is the next
   value of one numeric parameter in sorted order, or another value of a categorical one), ranked by
   the same acquisition. Good configs of tiling spaces sit next to each other (a tile twice as large,
   the next unroll factor); a global model with a few dozen points ranks that neighbourhood poorly, and
   restrictions such as ``block_x == block_y * tile_y`` make one-parameter moves invalid, so the
   two-step ring is needed.

Features: a numeric dimension whose values are all positive becomes ``log2(value)`` scaled to
[0, 1] (tile sizes and block sizes act multiplicatively); other numeric and boolean dimensions are
scaled linearly; categorical ones (swizzle, schedule names ...) are one-hot for the space-filling
design and one identity (same / different) column for the GP. A numeric dimension with more than two
values is also given an identity column for the GP (``numeric_identity``, on by default), which lets
the model represent effects that are not smooth in the value (a tile size that divides the problem,
one block shape that suits the hardware). Dimensions with one value are dropped. Huge spaces (more than ``ENUMERATE_LIMIT`` raw combinations) are represented by a fixed
random sample of ``SAMPLE_SIZE`` valid configs.

Needs NumPy and SciPy; :func:`available` says whether they import (else the tuner uses optuna's TPE).
"""

from __future__ import annotations

import importlib.util
import math
import random
from typing import Any, Callable, Sequence

from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace

#: raw combinations up to which the pool is the whole space (else a random sample of valid configs)
ENUMERATE_LIMIT = 200_000
SAMPLE_SIZE = 20_000
#: default number of space-filling configs (seeds included) before the model takes over
DEFAULT_STARTUP = 6
#: hyperparameters are refitted on every proposal up to this many results, then every REFIT_EVERY
REFIT_ALWAYS = 40
REFIT_EVERY = 4
#: a local step looks this many steps away from the incumbent at most
LOCAL_RADIUS = 2
#: space-filling designs: ``"maximin"`` (farthest point in feature space: corners first) or ``"levels"``
#: (first the configs with the most parameter values not tried yet, maximin among those)
DESIGNS = ("maximin", "levels")
#: floor of the probability of running in the acquisition (log space), so no candidate is ruled out
MIN_RUN_PROBABILITY = 1e-3


def available() -> bool:
    """Whether the candidate-set GP sampler can run here (NumPy and SciPy importable)."""
    return all(importlib.util.find_spec(m) is not None for m in ("numpy", "scipy"))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class CandidatePool:
    """The valid configs of a space, their optuna params and their feature vectors."""

    def __init__(self, space: SearchSpace, is_valid: Callable[[PipelineConfig], bool],
                 encode: Callable[[PipelineConfig], dict[str, Any] | None], seed: int | None = None,
                 numeric_identity: bool = True) -> None:
        import numpy as np

        if space.cardinality <= ENUMERATE_LIMIT:
            configs = [c for c in space if is_valid(c)]
        else:
            configs = _sample_valid(space, is_valid, random.Random(seed), SAMPLE_SIZE)
        self.configs: list[PipelineConfig] = []
        self.params: list[dict[str, Any]] = []
        for c in configs:
            p = encode(c)
            if p is not None:
                self.configs.append(c)
                self.params.append(p)
        self.index = {_param_key(p): i for i, p in enumerate(self.params)}
        rank_cols: list[list[float]] = []  # per dimension: the value's rank (numbers, sorted) or index (categories)
        rank_ordinal: list[bool] = []
        columns: list[list[float]] = []  # maximin features: scaled numbers and one-hot categories
        gp_cols: list[list[float]] = []  # GP inputs: ordinal columns and identity (category code) columns
        kinds: list[bool] = []
        for name, values in space.dims:
            if len(values) < 2:
                continue
            col = [c.get(name) for c in self.configs]
            codes = [float(values.index(v)) for v in col]
            numeric = all(_is_number(v) for v in values)
            order = sorted(values) if numeric else list(values)
            rank_cols.append([float(order.index(v)) for v in col])
            rank_ordinal.append(numeric)
            if numeric:
                logs = all(v > 0 for v in values)
                f = (lambda v: math.log2(v)) if logs else (lambda v: float(v))
                lo, hi = min(f(v) for v in values), max(f(v) for v in values)
                span = (hi - lo) or 1.0
                columns.append([(f(v) - lo) / span for v in col])
                gp_cols.append(columns[-1])
                kinds.append(False)
                if len(values) > 2 and numeric_identity:
                    gp_cols.append(codes)
                    kinds.append(True)
            elif len(values) == 2:
                columns.append([1.0 if v == values[1] else 0.0 for v in col])
                gp_cols.append(columns[-1])
                kinds.append(False)
            else:
                for cat in values:
                    columns.append([1.0 if v == cat else 0.0 for v in col])
                gp_cols.append(codes)
                kinds.append(True)
        n = len(self.configs)
        self.features = np.array(columns, dtype=float).T if columns else np.zeros((n, 1))
        self.gp_inputs = np.array(gp_cols, dtype=float).T if gp_cols else np.zeros((n, 1))
        self.gp_kinds = np.array(kinds if kinds else [False], dtype=bool)
        self.ranks = np.array(rank_cols, dtype=float).T if rank_cols else np.zeros((n, 1))
        self.rank_ordinal = np.array(rank_ordinal if rank_ordinal else [True], dtype=bool)

    def steps(self, i: int, others: Any) -> Any:
        """Neighbourhood distance of configs ``others`` (pool indices) from config ``i``: summed over the
        dimensions, the number of steps between the two values in sorted order (numeric dimensions) or
        1 for another value (categorical ones)."""
        import numpy as np

        d = self.ranks[others] - self.ranks[i][None, :]
        return np.where(self.rank_ordinal[None, :], np.abs(d), (d != 0).astype(float)).sum(1)

    def __len__(self) -> int:
        return len(self.configs)

    def lookup(self, params: dict[str, Any]) -> int | None:
        return self.index.get(_param_key(params))


def _param_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _sample_valid(space: SearchSpace, is_valid: Callable[[PipelineConfig], bool], rng: random.Random,
                  size: int) -> list[PipelineConfig]:
    out: dict[str, PipelineConfig] = {}
    for _ in range(size * 20):
        c = space.make({name: rng.choice(vals) for name, vals in space.dims})
        if c.key not in out and space.rejection(c) is None and is_valid(c):
            out[c.key] = c
            if len(out) >= size:
                break
    return list(out.values())


class CandidateGPSampler:
    """optuna sampler: space-filling start, then GP expected improvement over a :class:`CandidatePool`.

    Build it through :func:`make_candidate_sampler` (optuna is imported lazily). ``exhausted`` turns
    True when every config of the pool has been proposed.
    """

    def __init__(self, pool: CandidatePool, distributions: dict[str, Any], seed: int | None,
                 n_startup: int = DEFAULT_STARTUP, local_every: int = 0, design: str = "maximin",
                 additive: bool = False, stall_patience: int = 0) -> None:
        from .gp import GaussianProcess

        if design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, not {design!r}")

        self.pool = pool
        self.distributions = distributions
        self.rng = random.Random(seed)
        self.n_startup = max(1, n_startup)
        self.exhausted = len(pool) == 0
        self.additive = additive
        self.gp = GaussianProcess(additive=additive)
        self.last_pick: str = ""
        self.model_steps = 0
        self.local_every = max(0, int(local_every))
        self.design = design
        self.stall_patience = max(0, int(stall_patience))

    # -- optuna BaseSampler interface -----------------------------------------------------------
    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return dict(self.distributions)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        idx = self.propose(study.get_trials(deepcopy=False), exclude=trial.number)
        if idx is None:
            self.exhausted = True
            return {}
        return dict(self.pool.params[idx])

    def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
        # Reached only once the pool is exhausted (the search loop then stops on ``exhausted``).
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)  # type: ignore[attr-defined]

    # -- the algorithm --------------------------------------------------------------------------
    def propose(self, trials: Sequence[Any], exclude: int | None = None) -> int | None:
        """Index in the pool of the next config, given optuna's trials; None when all are tried."""
        import numpy as np

        tried: set[int] = set()
        done: list[tuple[int, float | None]] = []  # (pool index, value or None for a failure)
        for t in trials:
            if t.number == exclude:
                continue
            idx = self.pool.lookup(t.params)
            if idx is None:
                continue
            tried.add(idx)
            state = getattr(t.state, "name", str(t.state))
            if state == "COMPLETE" and t.value is not None and math.isfinite(t.value):
                done.append((idx, float(t.value)))
            elif state == "FAIL":
                done.append((idx, None))
        free = np.array([i for i in range(len(self.pool)) if i not in tried], dtype=int)
        if free.size == 0:
            return None
        values = [v for _, v in done if v is not None]
        if len(values) < self.n_startup or len(set(values)) < 2:
            self.last_pick = "space-filling"
            if self.design == "levels":
                return int(self._level_cover(free, sorted(tried)))
            return int(self._maximin(free, sorted(tried)))
        ran = [(i, v) for i, v in done if v is not None]
        xs = self.pool.gp_inputs[[i for i, _ in ran]]
        ys = np.array([v for _, v in ran])
        from .gp import GaussianProcess, expected_improvement

        # Hyperparameters are refitted on every proposal early on, then every few proposals
        # (in between only the posterior is updated): the fit dominates the cost for long searches.
        refit = len(ran) <= REFIT_ALWAYS or len(ran) % REFIT_EVERY == 0
        self.gp.fit(xs, ys, self.pool.gp_kinds, optimize=refit)
        mean, std = self.gp.predict(self.pool.gp_inputs[free])
        acq = expected_improvement(mean, std, float(ys.min()))
        if len(ran) < len(done):  # some failed: weigh by the modelled probability of running
            labels = np.array([0.0 if v is not None else 1.0 for _, v in done])
            fails = GaussianProcess(additive=self.additive).fit(self.pool.gp_inputs[[i for i, _ in done]], labels,
                                                                self.pool.gp_kinds)
            p_fail = np.clip(fails.predict(self.pool.gp_inputs[free])[0], 0.0, 1.0)
            acq = acq + np.log(np.maximum(1.0 - p_fail, MIN_RUN_PROBABILITY))
        self.model_steps += 1
        if self.local_every and self.model_steps % self.local_every == 0:
            dist = self.pool.steps(ran[int(np.argmin(ys))][0], free)
            for radius in range(1, LOCAL_RADIUS + 1):
                near = np.flatnonzero(dist <= radius)
                if near.size:
                    top = near[np.flatnonzero(acq[near] >= acq[near].max() - 1e-9)]
                    self.last_pick = "local"
                    return int(free[top[self.rng.randrange(len(top))]])
        if self.stall_patience and _since_improvement([v for _, v in done]) >= self.stall_patience:
            # The model has stopped finding better configs: it may be confidently wrong about an
            # interaction it has no data on (a fast corner of two parameters on a plateau), so
            # propose what tries the most value pairs not tried together yet, the model breaking ties.
            cover = self._pair_cover_counts(free, sorted(tried))
            cand = np.flatnonzero(cover >= cover.max())
            top = cand[np.flatnonzero(acq[cand] >= acq[cand].max() - 1e-9)]
            self.last_pick = "pairs"
            return int(free[top[self.rng.randrange(len(top))]])
        top = np.flatnonzero(acq >= acq.max() - 1e-9)
        self.last_pick = "model"
        return int(free[top[self.rng.randrange(len(top))]])

    def _pair_cover_counts(self, free: Any, tried: list[int]) -> Any:
        """For each free config: how many pairs of parameter values it has that no tried config had."""
        import numpy as np

        ranks = self.pool.ranks.astype(int)
        out = np.zeros(len(free))
        d = ranks.shape[1]
        for a in range(d):
            for b in range(a + 1, d):
                width = int(ranks[:, b].max()) + 1
                seen = np.unique(ranks[tried, a] * width + ranks[tried, b])
                out += ~np.isin(ranks[free, a] * width + ranks[free, b], seen)
        return out

    def _level_cover(self, free: Any, tried: list[int]) -> int:
        """The free config with the most parameter values no tried config has (maximin among those)."""
        import numpy as np

        if not tried:
            return int(free[self.rng.randrange(len(free))])
        ranks = self.pool.ranks
        new = np.zeros(len(free))
        for j in range(ranks.shape[1]):
            seen = np.unique(ranks[tried, j])
            new += ~np.isin(ranks[free, j], seen)
        cand = free[new >= new.max()]
        return self._maximin(cand, tried)

    def _maximin(self, free: Any, tried: list[int]) -> int:
        import numpy as np

        if not tried:
            return int(free[self.rng.randrange(len(free))])
        a, b = self.pool.features[free], self.pool.features[tried]
        d = ((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T).min(1)
        top = np.flatnonzero(d >= d.max() - 1e-12)
        return int(free[top[self.rng.randrange(len(top))]])


def _since_improvement(values: Sequence[float | None]) -> int:
    """Evaluations (failures, ``None``, included) since the best value last improved."""
    best, at = math.inf, 0
    for i, v in enumerate(values):
        if v is not None and v < best:
            best, at = v, i
    return len(values) - 1 - at


def make_candidate_sampler(pool: CandidatePool, distributions: dict[str, Any], seed: int | None,
                           n_startup: int = DEFAULT_STARTUP, local_every: int = 0, design: str = "maximin",
                           additive: bool = False, stall_patience: int = 0) -> Any:
    """A :class:`CandidateGPSampler` that is also an ``optuna.samplers.BaseSampler``."""
    import optuna

    cls = type("CandidateGPSampler", (CandidateGPSampler, optuna.samplers.BaseSampler), {})
    sampler = cls(pool, distributions, seed, n_startup, local_every, design, additive, stall_patience)
    sampler._fallback = optuna.samplers.RandomSampler(seed=seed)
    return sampler
