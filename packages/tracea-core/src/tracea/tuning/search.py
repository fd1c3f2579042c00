"""The search strategy: optuna over a finite :class:`~tracea.semantic.search_space.SearchSpace`.

Each dimension whose values are all numbers becomes an optuna integer over the *rank* of the sorted
values (tile sizes 16, 32, 64, 128 -> 0..3); other dimensions (swizzle, barrier, strings, bools) are
categorical. Samplers (``make_sampler``; the search loop builds ``"gp"`` itself since it needs the
enumerated candidates):

- ``"gp"``: Tracea's candidate-set Gaussian-process sampler (:mod:`tracea.tuning.candidates`, an optuna
  ``BaseSampler``; needs NumPy and SciPy): expected improvement over every valid, unmeasured config;
- ``"optuna-gp"``: optuna's stock ``GPSampler`` (needs torch and scipy), which optimises over the
  continuous relaxation of the ranks and cannot see the constraints; kept for comparison;
- ``"tpe"``: optuna's multivariate ``TPESampler`` (no extra dependencies);
- ``"random"``; ``"auto"``: ``"gp"`` where NumPy and SciPy import, else ``"tpe"``, with a one-time
  :class:`~tracea.errors.SamplerFallbackWarning` (so does ``"gp"`` asked for by name without SciPy).

Objectives are ``log(score seconds)``. optuna is imported lazily; its INFO logging and experimental
warnings are hushed only inside :func:`quiet_optuna` (restored afterwards, never changed process-wide).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import random
import warnings
from typing import Any, Iterable, Iterator

from ..errors import InvalidArgumentError, SamplerFallbackWarning
from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace


def _optuna() -> Any:
    import optuna

    return optuna


@contextlib.contextmanager
def quiet_optuna() -> Iterator[Any]:
    """``with quiet_optuna() as optuna:`` optuna with its INFO lines ("Trial 3 finished ...") and its
    ``ExperimentalWarning`` hushed for the duration of the block only: the caller's logging verbosity and
    warning filters are restored on exit (Tracea changes neither process-wide)."""
    optuna = _optuna()
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            yield optuna
    finally:
        optuna.logging.set_verbosity(before)


SAMPLERS = ("auto", "gp", "optuna-gp", "tpe", "random")


def gp_available() -> bool:
    """Whether the candidate-set GP sampler can run here (NumPy and SciPy importable)."""
    from .candidates import available

    return available()


def optuna_gp_available() -> bool:
    """Whether optuna's stock GPSampler can run here (torch and scipy importable)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "scipy"))


def resolve_sampler(kind: str) -> str:
    """The sampler ``kind`` stands for here (``"auto"`` -> ``"gp"`` or ``"tpe"``)."""
    if kind not in SAMPLERS:
        raise InvalidArgumentError("sampler", kind, "one of " + ", ".join(SAMPLERS))
    if kind in ("auto", "gp") and not gp_available():
        _warn_no_gp(kind)
        return "tpe"
    if kind == "auto":
        return "gp"
    return kind


_warned_no_gp = False


def _warn_no_gp(kind: str) -> None:
    """Say once per process that the documented default sampler cannot run here."""
    global _warned_no_gp
    if _warned_no_gp:
        return
    _warned_no_gp = True
    asked = "the default sampler ('gp', candidate-set Gaussian process)" if kind == "auto" else "sampler 'gp'"
    warnings.warn(f"{asked} needs SciPy, which is not installed; tuning uses optuna's TPE sampler instead. "
                  "Install it with: pip install 'tracea-core[gp]' (or pass sampler='tpe' to silence this).",
                  SamplerFallbackWarning, stacklevel=3)


def make_sampler(kind: str, seed: int | None, n_startup: int) -> Any:
    """An optuna sampler for ``"optuna-gp"``, ``"tpe"`` or ``"random"`` (``"gp"`` needs a candidate pool:
    :func:`tracea.tuning.candidates.make_candidate_sampler`)."""
    kind = resolve_sampler(kind)
    with quiet_optuna() as optuna:  # multivariate TPE and GPSampler warn that they are experimental
        if kind == "optuna-gp":
            if not hasattr(optuna.samplers, "GPSampler"):
                raise InvalidArgumentError("sampler", kind, "a sampler this optuna provides",
                                           hint=f"optuna {optuna.__version__} has no GPSampler; it needs optuna >= 3.6")
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup)
        if kind == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=True)
        if kind == "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise InvalidArgumentError("sampler", kind, "optuna-gp, tpe or random")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class SpaceEncoding:
    """Maps configs of a space to optuna parameters and back."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims: list[tuple[str, tuple[Any, ...], bool]] = []
        for name, values in space.dims:
            ordinal = len(values) > 1 and all(_is_number(v) for v in values)
            vals = tuple(sorted(values)) if ordinal else tuple(values)
            self.dims.append((name, vals, ordinal))

    def distributions(self) -> dict[str, Any]:
        optuna = _optuna()
        out: dict[str, Any] = {}
        for name, vals, ordinal in self.dims:
            if ordinal:
                out[name] = optuna.distributions.IntDistribution(0, len(vals) - 1)
            else:
                out[name] = optuna.distributions.CategoricalDistribution(
                    [getattr(v, "value", v) for v in vals])
        return out

    def decode(self, params: dict[str, Any]) -> PipelineConfig:
        assignment: dict[str, Any] = {}
        for name, vals, ordinal in self.dims:
            raw = params[name]
            if ordinal:
                assignment[name] = vals[int(raw)]
            else:
                assignment[name] = next(v for v in vals if getattr(v, "value", v) == raw)
        return self.space.make(assignment)

    def encode(self, config: PipelineConfig) -> dict[str, Any] | None:
        """optuna params for ``config``, or None when it lies outside the space."""
        params: dict[str, Any] = {}
        for name, vals, ordinal in self.dims:
            v = config.get(name)
            if v not in vals:
                return None
            params[name] = vals.index(v) if ordinal else getattr(v, "value", v)
        return params


def dedupe(configs: Iterable[PipelineConfig]) -> list[PipelineConfig]:
    seen: set[str] = set()
    out = []
    for c in configs:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out


class RandomSearch:
    """Uniform random search without replacement (the benchmark's baseline)."""

    def __init__(self, configs: list[PipelineConfig], seed: int | None) -> None:
        self.order = list(configs)
        random.Random(seed).shuffle(self.order)

    def __iter__(self) -> Any:
        return iter(self.order)


def objective_value(score_s: float) -> float:
    return math.log(max(score_s, 1e-12))
