"""One tuning session of a user kernel: compile, check and time configs through a backend's runner.

:class:`Session` holds everything that does not change between configs (the runner, the prepared
arguments, the checked answer, the space) and :meth:`Session.evaluate` turns one parameter dict
into a Kernel-Tuner-shaped result dict. :mod:`tracea.usertune.interface` drives it with a strategy.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import CompilationError, InvalidArgumentError, LaunchError, TraceaError, UnsupportedConfigError
from .launch import grid_dims, prepare_source, problem_dims, source_text, substitute
from .runner import KernelRunner, Launch
from .space import block_dims
from .verify import compare

#: what a failed config holds as its time, by failure (Kernel Tuner's strings)
COMPILE_FAILED, RUNTIME_FAILED, INVALID = "CompilationFailedConfig", "RuntimeFailedConfig", "InvalidConfig"


@dataclass
class Session:
    """The fixed parts of one ``tune_kernel`` / ``run_kernel`` call."""

    runner: KernelRunner
    kernel_name: str
    kernel_source: Any
    problem_size: Any
    arguments: Sequence[Any]
    args: Any  # the runner's prepared arguments
    grid_div: tuple[Any, Any, Any]
    block_size_names: Sequence[str]
    lang: str
    compiler_options: tuple[str, ...] = ()
    defines: Mapping[str, Any] | None = None
    smem_args: Mapping[str, Any] | None = None
    cmem_args: Mapping[str, Any] | None = None
    answer: list[Any] | None = None
    atol: float = 1e-6
    verify: Callable[..., Any] | None = None
    iterations: int = 7
    metrics: Mapping[str, Any] | None = None
    verbose: bool = False
    totals: dict[str, float] = field(default_factory=lambda: {"compile": 0.0, "verification": 0.0, "benchmark": 0.0})

    def launch_for(self, params: Mapping[str, Any]) -> Launch:
        """The kernel instance of ``params`` (geometry, source with defines, shared/constant memory)."""
        problem = problem_dims(self.problem_size, params)
        grid = grid_dims(problem, params, self.grid_div, self.block_size_names)
        block = block_dims(params, self.block_size_names)
        text = source_text(self.kernel_source, params) if self.lang != "TRITON" else ""
        name, src = (prepare_source(self.kernel_name, text, params, grid, block, self.block_size_names,
                                    self.lang, self.defines) if self.lang != "TRITON" else (self.kernel_name, ""))
        return Launch(name=name, source=src, grid=grid, block=block, params=dict(params),
                      compiler_options=tuple(self.compiler_options), smem_bytes=self._smem(params),
                      cmem_args=dict(self.cmem_args or {}), origin=self.kernel_source)

    def _smem(self, params: Mapping[str, Any]) -> int:
        if not self.smem_args:
            return 0
        size = self.smem_args.get("size", 0)
        if callable(size):
            size = size(dict(params))
        elif isinstance(size, str):
            size = eval(substitute(size, params), {"__builtins__": {}}, {})  # noqa: S307 - user's own expression
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise InvalidArgumentError("smem_args['size']", size, "a non-negative number of bytes")
        return int(size)

    def evaluate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Compile, check (with ``answer``/``verify``) and time one config; Kernel Tuner's result dict.

        A config that fails to compile or launch gets Kernel Tuner's failure string as its ``time``
        (and an ``__error__`` text); a wrong answer raises :class:`~tracea.errors.VerificationError`
        like Kernel Tuner does.
        """
        result: dict[str, Any] = dict(params)
        instance = ", ".join(f"{k}={v}" for k, v in params.items())
        launch = self.launch_for(params)
        t0 = time.perf_counter()
        try:
            kernel = self.runner.compile(launch)
        except CompilationError as exc:
            return self._failed(result, COMPILE_FAILED, exc, t0)
        except UnsupportedConfigError as exc:
            return self._failed(result, INVALID, exc, t0)
        t1 = time.perf_counter()
        self.totals["compile"] += t1 - t0
        try:
            if self.answer is not None or self.verify is not None:
                self.runner.reset_arguments(self.args)
                self.runner.run(kernel, self.args, launch)
                only = None if self.verify is not None else [i for i, a in enumerate(self.answer or []) if a is not None]
                compare(self.answer, self.runner.results(self.args, only), self.atol, self.verify, instance)
            t2 = time.perf_counter()
            times = [float(t) for t in self.runner.benchmark(kernel, self.args, launch, self.iterations)]
        except (LaunchError, UnsupportedConfigError) as exc:
            return self._failed(result, RUNTIME_FAILED, exc, t1)
        t3 = time.perf_counter()
        self.totals["verification"] += t2 - t1
        self.totals["benchmark"] += t3 - t2
        if not times or not all(math.isfinite(t) for t in times):
            return self._failed(result, RUNTIME_FAILED, TraceaError(f"non-finite times {times}"), t1)
        result.update(time=float(np.mean(times)), times=times, compile_time=1e3 * (t1 - t0),
                      verification_time=1e3 * (t2 - t1), benchmark_time=1e3 * (t3 - t2), strategy_time=0.0,
                      framework_time=0.0, timestamp=str(datetime.datetime.now(datetime.timezone.utc)))
        if self.metrics:
            result = apply_metrics(result, self.metrics)
        if self.verbose:
            print(f"{instance}, time={result['time']:.3f}ms")
        return result

    def _failed(self, result: dict[str, Any], kind: str, exc: BaseException, since: float) -> dict[str, Any]:
        text = ", ".join(f"{k}={v}" for k, v in result.items())
        result.update(time=kind, compile_time=1e3 * (time.perf_counter() - since), verification_time=0.0,
                      benchmark_time=0.0, strategy_time=0.0, framework_time=0.0,
                      timestamp=str(datetime.datetime.now(datetime.timezone.utc)))
        msg = str(exc).strip().splitlines()
        result["__error__"] = f"{kind}: {msg[0][:300] if msg else type(exc).__name__}"
        if self.verbose:
            print(f"{text}: skipped ({result['__error__']})")
        return result


def apply_metrics(result: dict[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Kernel Tuner's derived metrics: a string over parameters and earlier results, or a callable."""
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError("metrics", metrics, "a dict of name -> expression string or callable(result)")
    for name, how in metrics.items():
        if isinstance(how, str):
            try:
                result[name] = eval(substitute(how, {k: v for k, v in result.items() if not isinstance(v, (list, str))}),
                                    {"__builtins__": {}}, {})  # noqa: S307 - user's own expression
            except ZeroDivisionError:
                result[name] = math.inf
            except Exception as exc:  # noqa: BLE001
                raise InvalidArgumentError(f"metrics[{name!r}]", how, f"an expression over parameters and results ({exc})") from None
        elif callable(how):
            result[name] = how(result)
        else:
            raise InvalidArgumentError(f"metrics[{name!r}]", how, "an expression string or a callable")
    return result


def is_failure(result: Mapping[str, Any], objective: str = "time") -> bool:
    return "__error__" in result or not isinstance(result.get(objective), (int, float))
