"""Tuning on first use: a policy for calls whose signature nobody tuned.

``tracea.set_tuning("first-use")`` (or ``TRACEA_TUNING=first-use``) makes the first call of an untuned
signature time the top candidates on the call's own arrays, interleaved, within a small budget; the
fastest (of those whose output agrees with the default choice's) is persisted in the tuning cache like
any tuned result, so this and later processes run it. Default ``"off"`` for ``tracea.ops``: a first call
then costs one compilation, not several.

Candidates (:func:`alternatives`): the Doctor's choice with the next hero configs of its variant (at most
:data:`HEROES_CHOSEN`), then the other accepted variants the Doctor estimates at most :data:`ESTIMATE_SPAN`
times slower, each with its first :data:`HEROES_PER_VARIANT` heroes; at most :data:`MAX_CANDIDATES`. Each is
compiled before timing; compiling stops once :data:`COMPILE_BUDGET_S` is spent (two candidates at least).

Timing: each sample is a batch of back-to-back calls between two synchronizations (about
:data:`SAMPLE_S`), so it measures what a caller's eager calls cost (the kernel, or the launch where that is
longer) rather than one launch's host latency; :data:`ROUNDS` rounds in alternating order, the median per
candidate. A challenger replaces the default choice only when at most :data:`MARGIN` of its time.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from ..doctor.decision import Decision
from ..dtypes import DType
from ..errors import InvalidArgumentError, TraceaError

ENV = "TRACEA_TUNING"
MODES = ("off", "first-use")
MAX_CANDIDATES = 6
#: hero configs of the Doctor's chosen variant timed (its choice first): on an H100 the winners of the
#: first-use runs over LLM, odd-size, batched and CNN shapes were the chosen variant's first three heroes
#: in 115 of 119 signatures
HEROES_CHOSEN = 3
#: hero configs of each other variant timed
HEROES_PER_VARIANT = 2
#: other variants are timed only when the Doctor estimates them at most this many times slower than its
#: choice (each costs a compilation; the ones estimated 2.6-9x slower on large GEMMs never won)
ESTIMATE_SPAN = 2.5
#: rounds of samples, in alternating candidate order
ROUNDS = 5
#: the length of one sample: back-to-back calls between two synchronizations (at most MAX_CALLS calls)
SAMPLE_S = 2e-3
MAX_CALLS = 100
#: a challenger replaces the default choice only when its median time is at most this share of the
#: default's (timing noise must not trade a good default for a slower config)
MARGIN = 0.97
BUDGET_S = 0.5  # wall time for the timing rounds of one signature (compilation not counted)
#: compile (bind) no further candidate once this much wall time went into binding (at least two are bound)
COMPILE_BUDGET_S = 4.0

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


def _heroes(decision: Decision, candidate: Any, limit: int) -> list[Any]:
    from ..doctor.doctor import get_doctor

    configs = [candidate.config]
    try:
        for cfg in get_doctor().hero_configs(candidate.variant, decision.op, decision.profile):
            if len(configs) >= limit:
                break
            if cfg not in configs and candidate.variant.validate_config(decision.op, cfg, decision.profile):
                configs.append(cfg)
    except Exception:  # noqa: BLE001 - a broken hero list only narrows the choice
        pass
    return configs[:limit]


def _close_enough(candidate: Any, chosen: Any) -> bool:
    """Whether ``candidate``'s estimate is within :data:`ESTIMATE_SPAN` of the chosen one's (always, when
    either estimate is unusable)."""
    a, b = candidate.estimate_s, chosen.estimate_s
    if not (a == a and b == b) or b <= 0 or b == float("inf"):
        return True
    return a <= ESTIMATE_SPAN * b


def _trials(decision: Decision) -> list[tuple[Any, Any]]:
    """What first-use tuning times, the decision's choice first (see the module docstring)."""
    chosen = decision.chosen
    out: list[tuple[Any, Any]] = []
    for cand in decision.candidates:
        if cand.variant.fallback_only:
            continue
        if cand is chosen:
            limit = HEROES_CHOSEN
        elif cand.variant is chosen.variant or not _close_enough(cand, chosen):
            continue
        else:
            limit = HEROES_PER_VARIANT
        for cfg in _heroes(decision, cand, limit):
            if (cand.variant, cfg) not in out:
                out.append((cand.variant, cfg))
            if len(out) >= MAX_CANDIDATES:
                return out
    return out


def wants_tuning(decision: Decision, free: bool) -> bool:
    """Whether this first call should tune: the policy is on, nothing was forced, the winner's config is
    not a tuned one, and there is something to choose between."""
    if not free or tuning_mode() != "first-use":
        return False
    chosen = decision.chosen
    if chosen.source == "cache" or chosen.variant.fallback_only:
        return False
    return len(_trials(decision)) > 1


def alternatives(decision: Decision, limit: int = MAX_CANDIDATES) -> list[tuple[Any, Any]]:
    """Up to ``limit`` ``(variant, config)`` pairs other than the decision's choice that first-use tuning
    would time, in its order: the chosen variant's next hero configs, then the other accepted variants
    estimated close enough (:data:`ESTIMATE_SPAN`), each with its first hero configs (fallback-only oracles
    excluded)."""
    chosen = decision.chosen
    rest = [(v, c) for v, c in _trials(decision) if not (v is chosen.variant and c == chosen.config)]
    return rest[:limit]


def tune(decision: Decision, inputs: tuple, out: Any, adapter: Any,
         bind: Callable[[Any, Any], Callable[..., None]], *, clock: Callable[[], float] = time.perf_counter,
         sync: Callable[[], None] | None = None) -> bool:
    """Time the top candidates of ``decision`` on one call's packed ``inputs`` (writing ``out``) and
    persist the fastest that agrees with the default choice. ``bind(variant, config)`` returns a
    launcher; ``clock`` and ``sync`` (default: the device's synchronization hook) time it. Returns True
    when an entry was written (the caller decides again)."""
    if sync is None:
        from ..doctor.doctor import get_doctor

        pm = get_doctor().pm
        sync = lambda: pm.hook.tracea_synchronize(device=decision.profile.device)  # noqa: E731
    trials: list[tuple[Any, Any, Callable[..., None]]] = []
    began = clock()
    for variant, cfg in _trials(decision):
        if len(trials) >= 2 and clock() - began > COMPILE_BUDGET_S:
            break  # the first call has waited long enough for compilers
        try:
            trials.append((variant, cfg, bind(variant, cfg)))
        except TraceaError:
            continue  # it does not compile here: not a candidate
    if len(trials) < 2:
        return False
    ok = _agreeing(trials, inputs, out, adapter, decision.op)
    if len(ok) < 2:
        return False
    times = _time(ok, inputs, out, clock, sync)
    medians = [statistics.median(ts) for ts in times]
    default = ok[0] if ok[0][:2] == trials[0][:2] else None
    best = min(range(len(ok)), key=medians.__getitem__)
    if default is not None and best != 0 and medians[best] > MARGIN * medians[0]:
        best = 0  # not clearly faster than the default choice: keep it
    variant, config, _ = ok[best]
    # the winner's first hero (its default config), when it was timed: data for the performance model
    first = next((i for i, (v, _, _) in enumerate(ok) if v is variant), None)
    default_s = medians[first] if first is not None and ok[first][1] == _default(decision, variant) else 0.0
    return persist(decision, variant, config, times[best], default_s)


def _time(ok: list, inputs: tuple, out: Any, clock: Callable[[], float], sync: Callable[[], None]) -> list[list[float]]:
    """Seconds per call of each launcher in ``ok``: :data:`ROUNDS` samples of back-to-back calls between
    two synchronizations, candidates in alternating order, within :data:`BUDGET_S` (two rounds at least)."""
    calls = []
    for _, _, launch in ok:  # one synchronized call each sizes its samples
        sync()
        t0 = clock()
        launch(*inputs, out)
        sync()
        one = clock() - t0
        calls.append(max(1, min(MAX_CALLS, int(SAMPLE_S / one) if one > 0 else MAX_CALLS)))
    times: list[list[float]] = [[] for _ in ok]
    deadline = clock() + BUDGET_S
    for r in range(ROUNDS):
        order = list(range(len(ok))) if r % 2 == 0 else list(reversed(range(len(ok))))
        for i in order:
            launch, n = ok[i][2], calls[i]
            sync()
            t0 = clock()
            for _ in range(n):
                launch(*inputs, out)
            sync()
            times[i].append((clock() - t0) / n)
        if r >= 1 and clock() > deadline:
            break
    return times


def _default(decision: Decision, variant: Any) -> Any:
    """The config an untuned call runs on ``variant`` (the Doctor's default), or None."""
    from ..doctor.doctor import get_doctor

    try:
        found = get_doctor().default_config(variant, decision.op, decision.profile)
    except Exception:  # noqa: BLE001
        return None
    return None if isinstance(found, str) else found[0]


def _agreeing(trials: list, inputs: tuple, out: Any, adapter: Any, op: Any) -> list:
    """The trials whose output matches the first one's (the default choice) within the dtype's bound. A bf16
    output NumPy cannot hold (no ml_dtypes) is read back through a float32 copy, as the tuner's are: read as
    bf16 it raised, which dropped every trial, so bf16 signatures were never tuned on first use."""
    from ..tuning.inputs import carried

    widen = carried(op.out_dtype) if hasattr(op, "out_dtype") else False
    results = []
    for variant, cfg, launch in trials:
        try:
            launch(*inputs, out)
            host = adapter.to_host(adapter.astype(out, DType.F32) if widen else out)
            results.append((variant, cfg, launch, np.array(host, dtype=np.float64)))
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
