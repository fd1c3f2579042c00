"""``tracea.tune_kernel`` and ``tracea.run_kernel``: Kernel Tuner's entry points, run by Tracea.

Scripts written for Kernel Tuner run after changing the import: the common arguments keep their
names and meanings (see docs/kernel_tuner.md for what maps and what differs). The default strategy
is Tracea's Bayesian sampler; the best config also lands in Tracea's fingerprinted tuning cache, and a
later call for the same kernel, problem and device returns it without tuning unless ``retune=True``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Mapping, Sequence

from .._version import __version__
from ..errors import InvalidArgumentError, UnsupportedOptionError
from . import store, strategies
from .kt_cache import KTCache
from .launch import check_against_signature, source_text, substitute
from .runner import get_runner, normalize_lang
from .session import Session, is_failure
from .space import build_space, check_tune_params, compile_restrictions, to_config
from .verify import check_answer

_log = logging.getLogger("tracea.usertune")

#: Kernel Tuner options Tracea accepts only at their "off" value
_OFF_ONLY = {"texmem_args": "texture memory arguments are not supported",
             "simulation_mode": "simulation mode is not supported (replay a Kernel Tuner cache with Kernel Tuner)",
             "parallel": "parallel tuning over several GPUs is not supported",
             "observers": "observers (NVML, power, PMT, NCU) are not supported",
             "objectives": "multi-objective tuning is not supported; pass one objective"}


def _off(name: str, value: Any) -> None:
    if value is not None and value is not False and value != [] and value != {}:
        raise UnsupportedOptionError(name, _OFF_ONLY[name])


def _block_size_names(value: Any) -> list[str]:
    if value is None:
        return ["block_size_x", "block_size_y", "block_size_z"]
    if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) for n in value) or not 1 <= len(value) <= 3:
        raise InvalidArgumentError("block_size_names", value, "a list of 1 to 3 parameter names")
    return list(value)


def _objective(objective: Any, higher: Any) -> tuple[str, bool]:
    if objective is None:
        return "time", bool(higher) if higher is not None else False
    if not isinstance(objective, str):
        raise UnsupportedOptionError("objective", "one objective name (a result key such as 'time' or a metric)")
    return objective, bool(higher) if higher is not None else False


def _iterations(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError("iterations", value, "a positive integer")
    return value


def _compiler_options(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(o, str) for o in value):
        raise InvalidArgumentError("compiler_options", value, "a list of strings")
    return tuple(value)


def _open(kernel_name: Any, kernel_source: Any, arguments: Any, lang: Any, device: Any, platform: Any,
          compiler: Any, params_for_source: Mapping[str, Any]) -> tuple[str, Any, Any]:
    if not isinstance(kernel_name, str) or not kernel_name:
        raise InvalidArgumentError("kernel_name", kernel_name, "the kernel function's name")
    if not isinstance(arguments, (list, tuple)):
        raise InvalidArgumentError("arguments", arguments, "a list of NumPy arrays and NumPy scalars")
    is_triton = hasattr(kernel_source, "run") and hasattr(kernel_source, "fn")
    text = None if is_triton or callable(kernel_source) else source_text(kernel_source, params_for_source)
    lang_n = "TRITON" if is_triton and lang is None else normalize_lang(lang, text)
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise InvalidArgumentError("device", device, "a device index (int)")
    if isinstance(platform, bool) or not isinstance(platform, int) or platform < 0:
        raise InvalidArgumentError("platform", platform, "a platform index (int)")
    if lang_n != "TRITON":
        src = text if text is not None else source_text(kernel_source, params_for_source)
        check_against_signature(arguments, src, substitute(kernel_name, params_for_source), _is_array)
    runner = get_runner(lang_n, device, {"platform": platform, "compiler": compiler})
    return lang_n, runner, text


def _is_array(a: Any) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype") and len(getattr(a, "shape", ())) > 0


def tune_kernel(kernel_name: str, kernel_source: Any, problem_size: Any, arguments: Sequence[Any],
                tune_params: Mapping[str, Sequence[Any]], grid_div_x: Any = None, grid_div_y: Any = None,
                grid_div_z: Any = None, restrictions: Any = None, answer: Sequence[Any] | None = None,
                atol: float = 1e-6, verify: Callable[..., Any] | None = None, verbose: bool = False,
                lang: str | None = None, device: int = 0, platform: int = 0, smem_args: Mapping[str, Any] | None = None,
                cmem_args: Mapping[str, Any] | None = None, texmem_args: Any = None, compiler: str | None = None,
                compiler_options: Sequence[str] | None = None, defines: Mapping[str, Any] | None = None,
                log: Any = None, iterations: int = 7, block_size_names: Sequence[str] | None = None,
                quiet: bool = False, strategy: str | None = None, strategy_options: Mapping[str, Any] | None = None,
                cache: Any = None, metrics: Mapping[str, Any] | None = None, simulation_mode: Any = None,
                parallel: Any = None, observers: Any = None, objective: str | None = None,
                objective_higher_is_better: bool | None = None, objectives: Any = None, seed: int | None = None,
                *, retune: bool = False, tracea_cache: bool = True, heroes: Sequence[Mapping[str, Any]] = (),
                **unknown: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tune a user kernel like Kernel Tuner's ``tune_kernel``; returns ``(results, env)``.

    Same arguments and meanings as Kernel Tuner (``kernel_name``, ``kernel_source``, ``problem_size``,
    ``arguments``, ``tune_params``, ``grid_div_x/y/z``, ``restrictions``, ``answer``/``atol``/``verify``,
    ``lang`` = "CUDA" | "C" | "OpenCL", ``device``, ``platform``, ``smem_args``, ``cmem_args``,
    ``compiler``, ``compiler_options``, ``defines``, ``iterations``, ``block_size_names``, ``strategy``,
    ``strategy_options``, ``cache``, ``metrics``, ``objective``, ``objective_higher_is_better``, ``seed``).
    The default ``strategy`` is Tracea's Bayesian sampler (``"tracea"``, alias ``"bayes_opt"``);
    ``"brute_force"`` and ``"random_sample"`` behave as in Kernel Tuner.

    Tracea's own options: ``retune=True`` ignores Tracea's tuning cache and tunes again;
    ``tracea_cache=False`` neither reads nor writes it; ``heroes``: known-good configs (dicts) measured
    first (Tracea's sampler learns from them).

    :returns: ``results``: one dict per evaluated config with the parameters, ``time`` (ms, the mean of
        ``times``), ``times``, ``compile_time``, ``verification_time``, ``benchmark_time``, metrics and
        ``timestamp`` (failed configs hold Kernel Tuner's failure string as ``time``); ``env``: the device,
        options and Tracea's additions (``best_config``, ``strategy``, ``evaluations``, ``tracea_cache``).
    :raises UnsupportedOptionError: for an unknown option or one Tracea does not support.
    :raises InvalidArgumentError: (and subclasses) for malformed arguments, naming them.
    :raises VerificationError: when a config's output does not match ``answer``.
    """
    cache_only = bool(unknown.pop("_cache_only", False))  # @tracea.kernel's probe of Tracea's cache
    if unknown:
        name = sorted(unknown)[0]
        raise UnsupportedOptionError(name, "unknown option of tune_kernel (Kernel Tuner's options and Tracea's "
                                           "retune / tracea_cache / heroes are accepted)")
    for name, value in (("texmem_args", texmem_args), ("simulation_mode", simulation_mode), ("parallel", parallel),
                        ("observers", observers), ("objectives", objectives)):
        _off(name, value)
    if log:
        logging.basicConfig(level=log)
    started = time.perf_counter()
    params = check_tune_params(tune_params)
    names = list(params)
    bsn = _block_size_names(block_size_names)
    obj, higher = _objective(objective, objective_higher_is_better)
    iters = _iterations(iterations)
    copts = _compiler_options(compiler_options)
    strat, sopts = strategies.resolve(strategy, strategy_options)
    preds = compile_restrictions(restrictions, names)
    first = {n: v[0] for n, v in params.items()}
    lang_n, runner, text = _open(kernel_name, kernel_source, arguments, lang, device, platform, compiler, first)
    if lang_n == "C" and (cmem_args or smem_args):
        raise UnsupportedOptionError("cmem_args" if cmem_args else "smem_args", "has no meaning for C kernels")
    if lang_n == "OPENCL" and cmem_args:
        raise UnsupportedOptionError("cmem_args", "constant memory arguments are supported for CUDA kernels only")
    try:
        args = runner.prepare_arguments(arguments)
        checked_answer = check_answer(answer, arguments)
        if verify is not None and not callable(verify):
            raise InvalidArgumentError("verify", verify, "a callable verify(answer, result_host, atol=atol)")
        session = Session(runner=runner, kernel_name=kernel_name, kernel_source=kernel_source,
                          problem_size=problem_size, arguments=arguments, args=args,
                          grid_div=(grid_div_x, grid_div_y, grid_div_z), block_size_names=bsn, lang=lang_n,
                          compiler_options=copts, defines=defines, smem_args=smem_args, cmem_args=cmem_args,
                          answer=checked_answer, atol=float(atol), verify=verify, iterations=iters,
                          metrics=metrics, verbose=bool(verbose))
        space = build_space(params, preds, bsn, runner.max_threads)
        env = _environment(runner, kernel_name, problem_size, params, iters, copts, lang_n, strat)
        from .launch import problem_dims

        op = store.op_for(lang_n, kernel_name, problem_dims(problem_size, first) if not callable(problem_size) else (0, 0, 0),
                          arguments, runner.environment(), source=text if text is not None else kernel_source, problem_size=problem_size,
                          tune_params={k: list(v) for k, v in params.items()}, grid_div=[grid_div_x, grid_div_y, grid_div_z],
                          block_size_names=bsn, compiler_options=list(copts), defines=defines, objective=obj,
                          smem=smem_args, cmem=sorted((cmem_args or {}).keys()))
        variant = store.variant_for(lang_n, kernel_name)
        tcache = _tracea_cache() if tracea_cache else None
        if tcache is not None and not retune:
            hit = _from_cache(tcache, op, variant, runner, names, preds, session, space, env, obj)
            if hit is not None:
                return hit
        if cache_only:
            from .decorator import _NotCached

            raise _NotCached()
        seeds = _check_heroes(heroes, params)
        kt = KTCache(cache, device_name=runner.device_name, kernel_name=kernel_name, problem_size=problem_size,
                     tune_params=params, objective=obj) if cache else None
        results: list[dict[str, Any]] = []
        seen: dict[str, dict[str, Any]] = {}

        def evaluate(p: dict[str, Any]) -> float:
            key = ",".join(str(p[n]) for n in names)
            if key in seen:
                return _score(seen[key], obj, higher)
            stored = kt.get(p) if kt is not None else None
            if stored is not None:
                res = dict(stored)
                res.update(compile_time=0, verification_time=0, benchmark_time=0)
                if isinstance(res.get("time"), str):
                    res["__error__"] = res["time"]
            else:
                res = session.evaluate(p)
                if kt is not None:
                    kt.put(p, {k: v for k, v in res.items() if k != "__error__"})
            seen[key] = res
            results.append(res)
            return _score(res, obj, higher)

        try:
            evaluations = strategies.run(strat, sopts, space, names, evaluate, seed, seeds)
        finally:
            if kt is not None:
                kt.close()
        good = [r for r in results if not is_failure(r, obj)]
        env["evaluations"] = evaluations
        env["valid_results"] = len(good)
        env.update({f"total_{k}_time": 1e3 * v for k, v in session.totals.items()})
        env["overhead_time"] = 1e3 * (time.perf_counter() - started)
        if good:
            best = (max if higher else min)(good, key=lambda r: r[obj])
            env["best_config"] = best
            if tcache is not None:
                times_s = [t / 1e3 for t in best.get("times", [best["time"]])]
                env["tracea_cache"] = "stored" if store.record(tcache, op, variant, runner.profile,
                                                                to_config({n: best[n] for n in names}), times_s,
                                                                evaluations) else "not written"
            if not quiet:
                print("best performing configuration: " + ", ".join(f"{n}={best[n]}" for n in names)
                      + f", {obj}={best[obj]:.4g}")
        elif not quiet:
            reasons = sorted({str(r.get("time")) for r in results})
            print(f"no valid configuration: all {len(results)} evaluated configs failed ({', '.join(reasons)})")
        return results, env
    finally:
        runner.close()


def _check_heroes(heroes: Any, params: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    if not isinstance(heroes, (list, tuple)):
        raise InvalidArgumentError("heroes", heroes, "a list of config dicts")
    out = []
    for i, h in enumerate(heroes):
        if not isinstance(h, Mapping) or set(h) != set(params) or any(h[k] not in params[k] for k in params):
            raise InvalidArgumentError(f"heroes[{i}]", h, f"a dict giving every tunable parameter one of its values "
                                                          f"({', '.join(params)})")
        out.append({k: h[k] for k in params})
    return out


def _score(result: Mapping[str, Any], objective: str, higher: bool) -> float:
    if is_failure(result, objective):
        return math.inf
    v = float(result[objective])
    if not math.isfinite(v):
        return math.inf
    if higher:
        return 1.0 / v if v > 0 else math.inf
    return v if v > 0 else 1e-300


def _environment(runner: Any, kernel_name: str, problem_size: Any, params: Mapping[str, Any], iterations: int,
                 copts: tuple[str, ...], lang: str, strategy: str) -> dict[str, Any]:
    env: dict[str, Any] = {"device_name": runner.device_name, "kernel_name": kernel_name, "lang": lang,
                           "problem_size": "callable" if callable(problem_size) else problem_size,
                           "tune_params": {k: list(v) for k, v in params.items()}, "iterations": iterations,
                           "compiler_options": list(copts), "strategy": strategy, "tracea_version": __version__}
    env.update({str(k): v for k, v in runner.environment().items()})
    env["tracea_cache"] = "off"
    return env


def _tracea_cache() -> Any:
    from ..tuning.cache import get_cache

    return get_cache()


def _from_cache(tcache: Any, op: Any, variant: Any, runner: Any, names: list[str], preds: list[Any], session: Session,
                space: Any, env: dict[str, Any], obj: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    from .space import from_config

    entry = store.lookup(tcache, op, variant, runner.profile)
    if entry is None:
        return None
    p = from_config(entry.config, names)
    if any(v is None for v in p.values()) or space.rejection(to_config(p)) is not None:
        return None  # parameters renamed or restricted away since: tune again
    result = dict(p)
    result.update(time=1e3 * entry.median_s, times=[1e3 * entry.median_s], compile_time=0.0, verification_time=0.0,
                  benchmark_time=0.0, strategy_time=0.0, framework_time=0.0, tracea_cache="hit")
    if session.metrics:
        from .session import apply_metrics

        result = apply_metrics(result, session.metrics)
    env.update(tracea_cache="hit", evaluations=0, valid_results=1, best_config=result, tuned_trials=entry.trials)
    return [result], env


def run_kernel(kernel_name: str, kernel_source: Any, problem_size: Any, arguments: Sequence[Any],
               params: Mapping[str, Any], grid_div_x: Any = None, grid_div_y: Any = None, grid_div_z: Any = None,
               lang: str | None = None, device: int = 0, platform: int = 0, smem_args: Mapping[str, Any] | None = None,
               cmem_args: Mapping[str, Any] | None = None, texmem_args: Any = None, compiler: str | None = None,
               compiler_options: Sequence[str] | None = None, defines: Mapping[str, Any] | None = None,
               block_size_names: Sequence[str] | None = None, quiet: bool = False, log: Any = None,
               **unknown: Any) -> list[Any]:
    """Compile and run one config of a user kernel once, like Kernel Tuner's ``run_kernel``.

    :returns: host (NumPy) copies of every argument after the run, in argument order (scalars as
        passed). The caller's arrays are not modified.
    """
    if unknown:
        raise UnsupportedOptionError(sorted(unknown)[0], "unknown option of run_kernel")
    _off("texmem_args", texmem_args)
    if not isinstance(params, Mapping):
        raise InvalidArgumentError("params", params, "a dict of parameter name -> one value")
    checked = check_tune_params({k: [v] for k, v in params.items()}) if params else {}
    p = {k: v[0] for k, v in checked.items()}
    lang_n, runner, _ = _open(kernel_name, kernel_source, arguments, lang, device, platform, compiler, p)
    if lang_n == "C" and (cmem_args or smem_args):
        raise UnsupportedOptionError("cmem_args" if cmem_args else "smem_args", "has no meaning for C kernels")
    try:
        args = runner.prepare_arguments(arguments)
        session = Session(runner=runner, kernel_name=kernel_name, kernel_source=kernel_source, problem_size=problem_size,
                          arguments=arguments, args=args, grid_div=(grid_div_x, grid_div_y, grid_div_z),
                          block_size_names=_block_size_names(block_size_names), lang=lang_n,
                          compiler_options=_compiler_options(compiler_options), defines=defines, smem_args=smem_args,
                          cmem_args=cmem_args)
        launch = session.launch_for(p)
        kernel = runner.compile(launch)
        runner.run(kernel, args, launch)
        return runner.results(args)
    finally:
        runner.close()
