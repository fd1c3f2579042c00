"""Search strategies for user kernels: which configs of the space get compiled and timed.

- ``"brute_force"``: every valid config, in the order of the parameter lists (Kernel Tuner's default).
- ``"random_sample"``: a uniform sample without replacement: ``strategy_options["fraction"]`` of the
  valid space (default 0.1, as Kernel Tuner) or ``max_fevals`` configs.
- ``"tracea"`` (also accepted as ``"bayes_opt"``; the default): Tracea's candidate-set Bayesian sampler
  (:mod:`tracea.tuning.candidates`: a space-filling start, then a Gaussian process with expected
  improvement over every valid, unmeasured config, failed configs modelled apart as a probability of
  failing), through the same search loop that tunes Tracea's own kernels, set up for user kernels'
  spaces (a few hundred configs of tile / block / unroll parameters, a few dozen evaluations):

  * the start covers parameter *values* (:data:`DESIGN` ``"levels"``): each start config is one with the
    most values not tried yet, so every value of every parameter is tried early (a maximin start tries
    the corners of the space, and the fast value of a tile or unroll parameter is often an inner one);
  * the GP's kernel has one additive term per feature next to the joint one (:data:`ADDITIVE`): with a
    handful of points the model can tell "tile_x = 2 is fast" and "unroll = 0 is fast" apart and
    combine them, where a joint kernel alone only sees that two whole configs were fast;
  * every second model proposal is a local step (the best-ranked unmeasured config one or two steps
    from the best so far: :data:`LOCAL_EVERY`);
  * after :data:`STALL_PATIENCE` evaluations without a better config, the other proposals try the most
    parameter-value pairs not tried together yet (a fast combination of two values on an otherwise
    flat space is what an additive model is confidently wrong about).

  Budget: ``max_fevals`` (default :data:`DEFAULT_MAX_FEVALS`) and ``time_limit`` seconds.

Every strategy calls ``evaluate(params) -> score`` (lower is better; ``inf`` for a failed config).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Callable, Mapping, Sequence

from ..errors import InvalidArgumentError, UnsupportedOptionError
from ..semantic.search_space import SearchSpace
from .space import from_config, to_config

STRATEGIES = ("tracea", "bayes_opt", "brute_force", "random_sample")
#: evaluations Tracea's sampler spends when ``max_fevals`` is not given (see docs/kernel_tuner.md)
DEFAULT_MAX_FEVALS = 60
OPTIONS = {"max_fevals", "time_limit", "fraction", "seed", "n_startup"}
#: every LOCAL_EVERY-th model proposal of the default strategy is a local step around the best config so far
LOCAL_EVERY = 2
#: the default strategy's start design, GP kernel and stall rule (see the module docstring)
DESIGN = "levels"
ADDITIVE = True
STALL_PATIENCE = 10


def resolve(strategy: Any, options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(canonical strategy name, checked options)."""
    name = "tracea" if strategy is None else strategy
    if not isinstance(name, str) or name not in STRATEGIES:
        raise UnsupportedOptionError("strategy", f"{strategy!r} is not supported; use one of {', '.join(STRATEGIES)} "
                                                 "(Kernel Tuner's other strategies are not implemented)")
    opts = dict(options or {})
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise UnsupportedOptionError(f"strategy_options[{unknown[0]!r}]",
                                     f"not supported; known keys: {', '.join(sorted(OPTIONS))}")
    if "max_fevals" in opts:
        mf = opts["max_fevals"]
        if isinstance(mf, bool) or not isinstance(mf, int) or mf < 1:
            raise InvalidArgumentError("strategy_options['max_fevals']", mf, "a positive integer")
    if "fraction" in opts and not (isinstance(opts["fraction"], (int, float)) and 0 < opts["fraction"] <= 1):
        raise InvalidArgumentError("strategy_options['fraction']", opts["fraction"], "a number in (0, 1]")
    if "time_limit" in opts and not (isinstance(opts["time_limit"], (int, float)) and opts["time_limit"] > 0):
        raise InvalidArgumentError("strategy_options['time_limit']", opts["time_limit"], "positive seconds")
    return ("tracea" if name == "bayes_opt" else name), opts


def run(name: str, opts: Mapping[str, Any], space: SearchSpace, names: list[str],
        evaluate: Callable[[dict[str, Any]], float], seed: int | None, heroes: Sequence[dict[str, Any]] = ()) -> int:
    """Drive ``evaluate`` over ``space`` with strategy ``name``; returns how many configs were evaluated.
    ``heroes`` (valid ones) are evaluated first by the sampling strategies.

    :raises InvalidArgumentError: (for ``restrictions``) when no config of the space is valid, so that
        there is nothing to evaluate. A space whose configs all *fail* is not an error here: each is
        evaluated at most once, up to the budget, and the caller sees only failures.
    """
    if next(iter(space), None) is None:
        raise InvalidArgumentError("restrictions", None, "restrictions (and the device's block size limit) that "
                                   "leave at least one config of tune_params", hint="every config is excluded")
    deadline = time.monotonic() + float(opts["time_limit"]) if "time_limit" in opts else None
    seed = opts.get("seed", seed)
    hero_configs = [c for c in (to_config(h) for h in heroes) if space.rejection(c) is None]
    if name == "brute_force":
        count = 0
        for config in space:
            if (deadline is not None and time.monotonic() > deadline) or count >= opts.get("max_fevals", math.inf):
                break
            evaluate(from_config(config, names))
            count += 1
        return count
    if name == "random_sample":
        valid = list(space)
        n = int(opts["max_fevals"]) if "max_fevals" in opts else max(1, int(math.ceil(opts.get("fraction", 0.1) * len(valid))))
        count = 0
        keys = {c.key for c in hero_configs}
        order = hero_configs + [c for c in random.Random(seed).sample(valid, min(n, len(valid))) if c.key not in keys]
        for config in order[:n]:
            if deadline is not None and time.monotonic() > deadline:
                break
            evaluate(from_config(config, names))
            count += 1
        return count
    return _bayes(opts, space, names, evaluate, seed, deadline, hero_configs)


def _bayes(opts: Mapping[str, Any], space: SearchSpace, names: list[str], evaluate: Callable[[dict[str, Any]], float],
           seed: int | None, deadline: float | None, heroes: Sequence[Any] = ()) -> int:
    from ..tuning.goals import OptimizationGoal
    from ..tuning.loop import Validator, search
    from ..tuning.measure import Measurement

    def measure(config: Any) -> Measurement:
        score = evaluate(from_config(config, names))
        if not math.isfinite(score):
            return Measurement(config, status="error", reason="failed")
        return Measurement(config, times=[max(score, 1e-300)])

    records = search(space, measure, variant="user", goal=OptimizationGoal.MaximizeTFLOPS,
                     trials=int(opts.get("max_fevals", DEFAULT_MAX_FEVALS)), validator=Validator(space, lambda c: None),
                     sampler="auto", seed=seed, n_startup=opts.get("n_startup"), deadline=deadline,
                     seeds=[(c, "hero") for c in heroes], local_every=LOCAL_EVERY, design=DESIGN, additive=ADDITIVE,
                     stall_patience=STALL_PATIENCE)
    return sum(1 for r in records if r.status != "invalid")
