"""Tuning on first use: a policy for calls whose signature nobody tuned.

``tracea.set_tuning("first-use")`` (or ``TRACEA_TUNING=first-use``) makes the first call of an untuned
signature time the top candidates on the call's own arrays, interleaved, within a small budget; the
fastest (of those whose output agrees with the default choice's) is persisted in the tuning cache like
any tuned result, so this and later processes run it. Default ``"off"`` for ``tracea.ops``: a first call
then costs one compilation, not several. Candidates are the accepted variants in the Doctor's order,
each with its first hero configs (at most :data:`MAX_CANDIDATES`); each is compiled before timing.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from ..doctor.decision import Decision
from ..errors import InvalidArgumentError, TraceaError

ENV = "TRACEA_TUNING"
MODES = ("off", "first-use")
MAX_CANDIDATES = 6
HEROES_PER_VARIANT = 2
ROUNDS = 3
BUDGET_S = 0.5  # wall time for the timing rounds of one signature (compilation not counted)

_mode: str | None = None  # set_tuning() beats the environment


def set_tuning(mode: str | None) -> None:
    """Set the tuning policy of this process: ``"first-use"``, ``"off"``, or None to follow
    ``TRACEA_TUNING`` (default off)."""
    global _mode
    if mode is not None and str(mode).strip().lower() not in MODES:
        raise InvalidArgumentError("mode", mode, "'first-use', 'off' or None")
    _mode = None if mode is None else str(mode).strip().lower()
    from . import plans

    plans.invalidate("tuning policy changed")


def tuning_mode() -> str:
    """The policy in force: ``set_tuning``'s, else ``TRACEA_TUNING``'s, else ``"off"``."""
    if _mode is not None:
        return _mode
    value = os.environ.get(ENV, "off").strip().lower()
    return value if value in MODES else "off"


def wants_tuning(decision: Decision, free: bool) -> bool:
    """Whether this first call should tune: the policy is on, nothing was forced, the winner's config is
    not a tuned one, and there is something to choose between."""
    if not free or tuning_mode() != "first-use":
        return False
    chosen = decision.chosen
    if chosen.source == "cache" or chosen.variant.fallback_only:
        return False
    return len(decision.candidates) > 1 or len(_heroes(decision, chosen)) > 1


def _heroes(decision: Decision, candidate: Any) -> list[Any]:
    from ..doctor.doctor import get_doctor

    configs = [candidate.config]
    try:
        for cfg in get_doctor().hero_configs(candidate.variant, decision.op, decision.profile):
            if cfg not in configs and candidate.variant.validate_config(decision.op, cfg, decision.profile):
                configs.append(cfg)
            if len(configs) >= HEROES_PER_VARIANT:
                break
    except Exception:  # noqa: BLE001 - a broken hero list only narrows the choice
        pass
    return configs


def alternatives(decision: Decision, limit: int = MAX_CANDIDATES) -> list[tuple[Any, Any]]:
    """Up to ``limit`` ``(variant, config)`` pairs other than the decision's choice that first-use tuning
    would time: the accepted variants in the Doctor's order, each with its first hero configs (fallback-only
    oracles excluded)."""
    chosen = decision.chosen
    out: list[tuple[Any, Any]] = []
    for cand in decision.candidates:
        if cand.variant.fallback_only:
            continue
        for cfg in _heroes(decision, cand):
            if cand.variant is chosen.variant and cfg == chosen.config:
                continue
            out.append((cand.variant, cfg))
            if len(out) >= limit:
                return out
    return out


def tune(decision: Decision, inputs: tuple, out: Any, adapter: Any,
         bind: Callable[[Any, Any], Callable[..., None]]) -> bool:
    """Time the top candidates of ``decision`` on one call's packed ``inputs`` (writing ``out``) and
    persist the fastest that agrees with the default choice. ``bind(variant, config)`` returns a
    launcher. Returns True when an entry was written (the caller decides again)."""
    from ..doctor.doctor import get_doctor

    doctor = get_doctor()
    trials: list[tuple[Any, Any, Callable[..., None]]] = []
    for cand in decision.candidates:
        if cand.variant.fallback_only:
            continue
        for cfg in _heroes(decision, cand):
            try:
                trials.append((cand.variant, cfg, bind(cand.variant, cfg)))
            except TraceaError:
                continue  # it does not compile here: not a candidate
            if len(trials) >= MAX_CANDIDATES:
                break
        if len(trials) >= MAX_CANDIDATES:
            break
    if len(trials) < 2:
        return False
    ok = _agreeing(trials, inputs, out, adapter, decision.op)
    if len(ok) < 2:
        return False
    sync = lambda: doctor.pm.hook.tracea_synchronize(device=decision.profile.device)  # noqa: E731
    times: dict[int, list[float]] = {i: [] for i in range(len(ok))}
    deadline = time.perf_counter() + BUDGET_S
    for r in range(ROUNDS):
        order = list(range(len(ok))) if r % 2 == 0 else list(reversed(range(len(ok))))
        for i in order:
            launch = ok[i][2]
            sync()
            t0 = time.perf_counter()
            launch(*inputs, out)
            sync()
            times[i].append(time.perf_counter() - t0)
        if time.perf_counter() > deadline and r >= 1:
            break
    medians = {i: statistics.median(ts) for i, ts in times.items() if ts}
    best = min(medians, key=medians.get)  # type: ignore[arg-type]
    variant, config, _ = ok[best]
    # the winner's first hero (its default config), when it was timed: data for the performance model
    first = next((i for i, (v, _, _) in enumerate(ok) if v is variant), None)
    default_s = medians.get(first, 0.0) if first is not None and ok[first][1] == _default(decision, variant) else 0.0
    return persist(decision, variant, config, times[best], default_s)


def _default(decision: Decision, variant: Any) -> Any:
    """The config an untuned call runs on ``variant`` (the Doctor's default), or None."""
    from ..doctor.doctor import get_doctor

    try:
        found = get_doctor().default_config(variant, decision.op, decision.profile)
    except Exception:  # noqa: BLE001
        return None
    return None if isinstance(found, str) else found[0]


def _agreeing(trials: list, inputs: tuple, out: Any, adapter: Any, op: Any) -> list:
    """The trials whose output matches the first one's (the default choice) within the dtype's bound."""
    results = []
    for variant, cfg, launch in trials:
        try:
            launch(*inputs, out)
            results.append((variant, cfg, launch, np.array(adapter.to_host(out), dtype=np.float64)))
        except TraceaError:
            continue
    if not results:
        return []
    ref = results[0][3]
    finite = np.isfinite(ref)
    scale = float(np.linalg.norm(ref[finite])) or 1.0
    keep = []
    for variant, cfg, launch, res in results:
        if not np.array_equal(np.isfinite(res), finite):
            continue
        if float(np.linalg.norm(res[finite] - ref[finite])) / scale <= _tolerance(op):
            keep.append((variant, cfg, launch))
    return keep


def _tolerance(op: Any) -> float:
    """Two correct kernels differ by rounding: about the output dtype's (or TF32's) epsilon."""
    from ..dtypes import DType, Fp32Precision

    dt = op.out_dtype.storage if hasattr(op, "out_dtype") else DType.F32
    if dt in (DType.F16, DType.BF16):
        return 3e-2
    if getattr(op, "fp32_precision", Fp32Precision.HIGHEST) is not Fp32Precision.HIGHEST:
        return 2e-2
    return 1e-4


def persist(decision: Decision, variant: Any, config: Any, times: list[float], default_s: float = 0.0) -> bool:
    """Write ``config`` of ``variant`` for ``decision``'s op as a tuned entry with the measured ``times``
    (seconds per call; ``default_s``: the default config's time, data for the performance model). False
    when no tuning cache can take it."""
    try:
        from ..tuning.cache import get_cache
        from ..tuning.goals import time_stats

        cache = get_cache()
        stats = time_stats(times)
        if default_s > 0:
            stats["default_s"] = default_s
        cache.put(cache.make_entry(decision.op, variant, decision.profile, config, stats, trials=len(times)))
        return True
    except Exception:  # noqa: BLE001 - no cache: this process still ran the default
        return False
