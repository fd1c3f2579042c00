"""Measuring one candidate config: compile, check against the reference, warm up, time with rotating
inputs, summarise. Also the core's fallback ``tracea_measure`` hook (``time.perf_counter`` around each
run plus ``tracea_synchronize``), registered as a built-in plugin; backends with device timers
(CUDA events, OpenCL profiling) implement the hook for their own variants and win over it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable


from ..errors import BackendError, CompilationError, LaunchError, TraceaError, UnsupportedConfigError
from ..plugins.manager import hookimpl
from ..semantic.config import PipelineConfig
from .goals import OptimizationGoal, time_stats
from .inputs import InputSets
from .refcheck import as_check


@hookimpl(trylast=True)
def tracea_measure(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int,
                   repeats: int) -> list[float]:
    from ..plugins.manager import get_plugin_manager

    hook = get_plugin_manager().hook
    device = profile.device
    for _ in range(max(0, warmup)):
        hook.tracea_run_variant(variant=variant, op=op, config=config, args=args, profile=profile)
    hook.tracea_synchronize(device=device)
    times = []
    for _ in range(max(0, repeats)):
        t0 = time.perf_counter()
        hook.tracea_run_variant(variant=variant, op=op, config=config, args=args, profile=profile)
        hook.tracea_synchronize(device=device)
        times.append(time.perf_counter() - t0)
    return times


#: statuses of a measurement; every one but "ok" is a failed trial.
OK, INVALID, COMPILE, LAUNCH, WRONG, TIMEOUT, ERROR = ("ok", "invalid", "compile_error", "launch_error",
                                                     "wrong_result", "timeout", "error")


@dataclass
class Measurement:
    """The outcome of measuring one config: ``status`` ``ok`` with ``times``, or a failure ``reason``."""

    config: PipelineConfig
    status: str = OK
    times: list[float] = field(default_factory=list)
    reason: str = ""
    error: float = 0.0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK and bool(self.times)

    @property
    def stats(self) -> dict[str, float]:
        return time_stats(self.times)

    def score(self, goal: OptimizationGoal) -> float:
        return goal.score(self.times) if self.ok else math.inf


class Measurer:
    """Times configs of variants for one op on one device.

    :param op: the op.
    :param profile: the device profile.
    :param pm: the plugin manager (its hooks prepare, run, time and synchronize).
    :param inputs: the rotating :class:`InputSets` on the device.
    :param reference: the check of input set 0's output: a :class:`~.refcheck.ReferenceCheck` (possibly
        sampled), the full expected output (host array), or None to skip the check.
    :param tol: the relative-error bound of the check.
    :param warmup: untimed runs before timing.
    :param min_repeats / max_repeats: bounds on timed runs; between them, as many as fit ``budget_s``.
    :param timeout_s: a config whose first run, or whose timing, exceeds this fails as a timeout.
    """

    def __init__(self, op: Any, profile: Any, pm: Any, inputs: InputSets, reference: Any,
                 tol: float, *, warmup: int = 2, min_repeats: int = 5, max_repeats: int = 50,
                 budget_s: float = 0.25, timeout_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.op, self.profile, self.pm, self.inputs = op, profile, pm, inputs
        self.reference, self.tol = as_check(reference), tol
        self.warmup, self.min_repeats, self.max_repeats = warmup, min_repeats, max_repeats
        self.budget_s, self.timeout_s, self.clock = budget_s, timeout_s, clock
        self._turn = 0

    def _run_checked(self, variant: Any, config: PipelineConfig) -> tuple[float, float]:
        hook = self.pm.hook
        self.inputs.poison(0)
        hook.tracea_synchronize(device=self.profile.device)
        t0 = self.clock()
        hook.tracea_run_variant(variant=variant, op=self.op, config=config, args=self.inputs.args[0],
                                profile=self.profile)
        hook.tracea_synchronize(device=self.profile.device)
        first = self.clock() - t0
        err = 0.0
        if self.reference is not None:
            err = self.reference.error(self.inputs.output(0))
        return first, err

    def _timed(self, variant: Any, config: PipelineConfig, warmup: int) -> list[float]:
        i = self._turn % len(self.inputs)
        self._turn += 1
        times = self.pm.hook.tracea_measure(variant=variant, op=self.op, config=config,
                                            args=self.inputs.args[i], profile=self.profile,
                                            warmup=warmup, repeats=1)
        return [float(t) for t in (times or [])]

    def measure(self, variant: Any, config: PipelineConfig) -> Measurement:
        """Measure ``config``; never raises for a failing config (the failure is the result)."""
        start = self.clock()
        m = Measurement(config)
        try:
            self.pm.hook.tracea_prepare_variant(variant=variant, op=self.op, config=config, profile=self.profile)
            first, err = self._run_checked(variant, config)
            m.error = err
            if not err <= self.tol:
                m.status, m.reason = WRONG, (f"relative error {err:.2e} exceeds {self.tol:.0e} against the "
                                             f"reference" if math.isfinite(err) else
                                             "output has NaN/inf or unwritten elements")
                return m
            if self.timeout_s is not None and first > self.timeout_s:
                m.status, m.reason = TIMEOUT, f"one run took {first:.3g} s > timeout {self.timeout_s:.3g} s"
                return m
            est = self._timed(variant, config, self.warmup)
            est_t = min(est) if est else first
            m.times.extend(est)
            n = int(min(self.max_repeats, max(self.min_repeats, self.budget_s / max(est_t, 1e-9))))
            while len(m.times) < n:
                m.times.extend(self._timed(variant, config, 0))
                if self.timeout_s is not None and self.clock() - start > self.timeout_s:
                    if len(m.times) < 3:
                        m.status, m.reason = TIMEOUT, f"timing exceeded {self.timeout_s:.3g} s"
                    break
            if not m.times:
                m.status, m.reason = ERROR, "the measure hook returned no times"
        except CompilationError as exc:
            m.status, m.reason = COMPILE, _msg(exc)
        except LaunchError as exc:
            m.status, m.reason = LAUNCH, _msg(exc)
        except UnsupportedConfigError as exc:
            m.status, m.reason = INVALID, _msg(exc)
        except (BackendError, TraceaError) as exc:
            m.status, m.reason = ERROR, _msg(exc)
        except (MemoryError, RecursionError, ArithmeticError, ValueError, TypeError, RuntimeError,
                IndexError, KeyError, AttributeError, OSError, NotImplementedError) as exc:
            m.status, m.reason = ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            m.wall_s = self.clock() - start
        return m


def _msg(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
