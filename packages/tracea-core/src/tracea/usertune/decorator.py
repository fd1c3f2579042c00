"""``@tracea.kernel``: describe a kernel once, get a callable that tunes on demand and runs the best config.

The decorator takes the seed's (Tessera) arguments, ``tile_shape``, ``shared_memory``, ``num_warps``,
``autotune``, ``autotune_configs`` and ``target``, plus the tuning description a Kernel Tuner user
knows (``tune_params``, ``restrictions``, ``heroes``, ``reference``, ``atol``, ``strategy``...). The
decorated function receives the call's arguments and returns a :class:`KernelLaunch`: the source
(code, file name or a generator of the parameters), the problem size and grid divisors::

    @tracea.kernel(target="cuda", autotune=True,
                   tune_params={"block_size_x": [64, 128, 256], "tile": [1, 2, 4]},
                   restrictions=["block_size_x * tile <= 1024"],
                   heroes=[{"block_size_x": 128, "tile": 2}],
                   reference=lambda c, a, b, n: [a + b, None, None, None])
    def vector_add(c, a, b, n):
        return tracea.KernelLaunch(SOURCE, problem_size=int(n), grid_div_x=["block_size_x", "tile"])

    vector_add(c, a, b, np.int32(n))          # tunes on first use (autotune=True), writes c
    vector_add.tune(c, a, b, np.int32(n))     # or tune explicitly; (results, env) like tune_kernel

Without ``autotune`` the call runs, in order: a config tuned earlier for this kernel and problem (Tracea's
tuning cache), the first hero, the first of ``autotune_configs``, or the config the seed arguments
spell (``num_warps`` -> ``block_size_x = 32 * num_warps`` for CUDA, ``tile_shape`` ->
``tile_size_x/y/z``, ``shared_memory`` -> dynamic shared memory bytes). ``autotune_configs`` alone
makes the search space exactly those configs. Calls run on the caller's arrays (NumPy, CuPy, torch
CUDA tensors; the backends copy where the device needs it) and write them like the kernel does.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import BackendError, InvalidArgumentError
from .interface import _open, tune_kernel
from .session import Session
from .space import check_tune_params
from .verify import check_answer, compare

_TARGETS = {"cuda": "CUDA", "c": "C", "cpu": "C", "opencl": "OpenCL", "triton": "TRITON"}


@dataclass
class KernelLaunch:
    """What one call launches: ``source`` (code, file name, generator of the params, or a Triton
    JIT function), ``problem_size``, ``grid_div_x/y/z``, and optionally ``name`` (default: the decorated
    function's), ``arguments`` (default: the call's), ``compiler_options``, ``defines``,
    ``block_size_names``, ``smem_args``, ``cmem_args``."""

    source: Any
    problem_size: Any
    grid_div_x: Any = None
    grid_div_y: Any = None
    grid_div_z: Any = None
    name: str | None = None
    arguments: Sequence[Any] | None = None
    compiler_options: Sequence[str] | None = None
    defines: Mapping[str, Any] | None = None
    block_size_names: Sequence[str] | None = None
    smem_args: Mapping[str, Any] | None = None
    cmem_args: Mapping[str, Any] | None = None


@dataclass
class _Compiled:
    runner: Any
    kernels: dict[str, Any] = field(default_factory=dict)


class TunableKernel:
    """The callable ``@tracea.kernel`` returns (see the module docstring)."""

    def __init__(self, describe: Callable[..., KernelLaunch], *, target: str, autotune: bool,
                 tune_params: Mapping[str, Sequence[Any]] | None, autotune_configs: Sequence[Mapping[str, Any]] | None,
                 restrictions: Any, heroes: Sequence[Mapping[str, Any]], reference: Callable[..., Any] | None,
                 atol: float, fixed: dict[str, Any], smem_bytes: int, tune_options: dict[str, Any]) -> None:
        if not isinstance(target, str) or target.lower() not in _TARGETS:
            raise InvalidArgumentError("target", target, "one of " + ", ".join(_TARGETS))
        self.describe = describe
        self.lang = _TARGETS[target.lower()]
        self.autotune = bool(autotune)
        self.configs = [dict(c) for c in (autotune_configs or [])]
        for i, c in enumerate(self.configs):
            if not c:
                raise InvalidArgumentError(f"autotune_configs[{i}]", c, "a non-empty dict of parameter values")
        space = dict(tune_params or {})
        if not space and self.configs:
            keys = list(dict.fromkeys(k for c in self.configs for k in c))
            for c in self.configs:
                if list(c) != keys:
                    raise InvalidArgumentError("autotune_configs", c, f"every config setting the same keys {keys}")
            space = {k: list(dict.fromkeys(c[k] for c in self.configs)) for k in keys}
            members = {tuple(c[k] for k in keys) for c in self.configs}
            only = [lambda p, _m=members, _k=keys: tuple(p[k] for k in _k) in _m]
            restrictions = only + (list(restrictions) if isinstance(restrictions, (list, tuple)) else
                                   [restrictions] if restrictions is not None else [])
        if space:
            for k, v in fixed.items():  # seed arguments fix what is not tuned
                space.setdefault(k, [v])
        self.tune_params = check_tune_params(space) if space else {}
        self.restrictions = restrictions
        self.heroes = [dict(h) for h in heroes]
        for i, h in enumerate(self.heroes):
            bad = [k for k in h if k not in self.tune_params]
            if bad:
                raise InvalidArgumentError(f"heroes[{i}]", h, f"values of the tunable parameters {list(self.tune_params)}")
            for k, v in self.tune_params.items():
                h.setdefault(k, v[0] if len(v) == 1 else None)
            if any(v is None for v in h.values()):
                raise InvalidArgumentError(f"heroes[{i}]", heroes[i], f"a value for every tunable parameter {list(self.tune_params)}")
        self.reference = reference
        self.atol = atol
        self.fixed = fixed
        self.smem_bytes = smem_bytes
        self.tune_options = tune_options
        self.best: dict[str, dict[str, Any]] = {}
        self._compiled: _Compiled | None = None
        self._lock = threading.RLock()
        functools.update_wrapper(self, describe)

    # -- describing one call --------------------------------------------------------------------
    def _launch(self, args: Sequence[Any]) -> tuple[KernelLaunch, str, list[Any]]:
        spec = self.describe(*args)
        if not isinstance(spec, KernelLaunch):
            raise InvalidArgumentError("kernel description", spec, "a tracea.KernelLaunch returned by the decorated function")
        name = spec.name or self.describe.__name__
        arguments = list(spec.arguments) if spec.arguments is not None else list(args)
        return spec, name, arguments

    def _options(self, spec: KernelLaunch) -> dict[str, Any]:
        smem = spec.smem_args or ({"size": self.smem_bytes} if self.smem_bytes else None)
        return dict(grid_div_x=spec.grid_div_x, grid_div_y=spec.grid_div_y, grid_div_z=spec.grid_div_z,
                    compiler_options=spec.compiler_options, defines=spec.defines,
                    block_size_names=spec.block_size_names, smem_args=smem, cmem_args=spec.cmem_args,
                    lang=None if self.lang == "TRITON" else self.lang)

    def _answer(self, arguments: Sequence[Any]) -> Any:
        if self.reference is None:
            return None
        return self.reference(*arguments)

    # -- tuning ---------------------------------------------------------------------------------
    def tune(self, *args: Any, **options: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Tune for these arguments' problem (``tune_kernel`` options may be passed); returns
        ``(results, env)`` and remembers the best config for later calls."""
        if not self.tune_params:
            raise InvalidArgumentError("tune_params", None, "tunable parameters (tune_params or autotune_configs) to tune")
        spec, name, arguments = self._launch(args)
        opts = self._options(spec)
        opts.update(self.tune_options)
        opts.update(options)
        opts.setdefault("quiet", True)
        strategy_options = dict(opts.pop("strategy_options", None) or {})
        restrictions = self.restrictions
        results, env = tune_kernel(name, spec.source, spec.problem_size, arguments, self.tune_params,
                                   restrictions=restrictions, answer=self._answer(arguments), atol=self.atol,
                                   strategy_options=strategy_options or None, heroes=self.heroes, **opts)
        best = env.get("best_config")
        if best is not None:
            self.best[self._key(spec, arguments)] = {k: best[k] for k in self.tune_params}
        return results, env

    def _key(self, spec: KernelLaunch, arguments: Sequence[Any]) -> str:
        from .store import signature_hash

        return signature_hash(problem=spec.problem_size, arguments=list(arguments))

    def config_for(self, *args: Any) -> dict[str, Any]:
        """The config a call with these arguments runs (tuning first when ``autotune`` and untuned)."""
        spec, name, arguments = self._launch(args)
        key = self._key(spec, arguments)
        with self._lock:
            if key in self.best:
                return self.best[key]
            if self.tune_params:
                cached = self._cached(spec, name, arguments)
                if cached is not None:
                    self.best[key] = cached
                    return cached
                if self.autotune:
                    results, _ = self.tune(*args)
                    if key in self.best:
                        return self.best[key]
                    if results:  # every config evaluated failed: running one of them would only fail again
                        reasons = sorted({str(r.get("time")) for r in results})
                        raise BackendError(f"autotuning {name!r}: none of the {len(results)} configs "
                                           f"tried ran ({', '.join(reasons)}); see .tune(...)'s results for each "
                                           f"config's error", log="\n".join(sorted({str(r["__error__"]) for r in results
                                                                                    if r.get("__error__")}))[:4000])
            base = {k: v[0] for k, v in self.tune_params.items()}
            if self.heroes:
                return {**base, **self.heroes[0]}
            if self.configs:
                return {**base, **self.configs[0]}
            return {**{k: v[0] for k, v in self.tune_params.items()}, **self.fixed} if self.tune_params else dict(self.fixed)

    def _cached(self, spec: KernelLaunch, name: str, arguments: Sequence[Any]) -> dict[str, Any] | None:
        """A config tuned earlier (Tracea's cache), found by asking tune_kernel for a cache hit only."""
        opts = self._options(spec)
        opts.update({k: v for k, v in self.tune_options.items() if k in ("iterations", "objective", "compiler_options")})
        try:
            _, env = tune_kernel(name, spec.source, spec.problem_size, arguments, self.tune_params,
                                 restrictions=self.restrictions, quiet=True, strategy_options={"max_fevals": 1},
                                 _cache_only=True, **opts)
        except _NotCached:
            return None
        best = env.get("best_config")
        return {k: best[k] for k in self.tune_params} if best else None

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        """Run the kernel on ``args`` with the best known config; outputs are written into the arrays."""
        config = self.config_for(*args)
        return self.run(*args, config=config)

    def run(self, *args: Any, config: Mapping[str, Any] | None = None, check: bool = False) -> None:
        """Run with ``config`` (default: the best known) on the caller's arrays. ``check=True`` also
        compares the outputs against ``reference`` and raises VerificationError when they differ."""
        spec, name, arguments = self._launch(args)
        params = dict(config if config is not None else self.config_for(*args))
        opts = self._options(spec)
        with self._lock:
            if self._compiled is None:
                lang, runner, _ = _open(name, spec.source, arguments, opts["lang"], 0, 0, None, params)
                self._compiled = _Compiled(runner)
            runner = self._compiled.runner
            dev_args = runner.prepare_arguments(arguments, inplace=True)
            session = Session(runner=runner, kernel_name=name, kernel_source=spec.source, problem_size=spec.problem_size,
                              arguments=arguments, args=dev_args, grid_div=(spec.grid_div_x, spec.grid_div_y, spec.grid_div_z),
                              block_size_names=list(spec.block_size_names or ["block_size_x", "block_size_y", "block_size_z"]),
                              lang=runner.lang, compiler_options=tuple(spec.compiler_options or ()), defines=spec.defines,
                              smem_args=opts["smem_args"], cmem_args=spec.cmem_args)
            launch = session.launch_for(params)
            key = launch.name + "\0" + launch.source + "\0" + repr(launch.compiler_options) + repr(sorted(params.items()))
            kernel = self._compiled.kernels.get(key)
            if kernel is None:
                kernel = runner.compile(launch)
                self._compiled.kernels[key] = kernel
            runner.run(kernel, dev_args, launch)
            if check and self.reference is not None:
                answer = check_answer(self._answer(arguments), arguments)
                compare(answer, runner.results(dev_args), self.atol, None, ", ".join(f"{k}={v}" for k, v in params.items()))
            runner.copy_back(dev_args)
        return None


class _NotCached(Exception):
    """Raised inside tune_kernel's cache-only probe when Tracea's cache has no entry."""


def kernel(fn: Callable[..., KernelLaunch] | None = None, *, tile_shape: tuple[int, ...] | None = None,
           shared_memory: int = 0, num_warps: int = 4, autotune: bool = False,
           autotune_configs: Sequence[Mapping[str, Any]] | None = None, target: str = "cuda",
           tune_params: Mapping[str, Sequence[Any]] | None = None, restrictions: Any = None,
           heroes: Sequence[Mapping[str, Any]] = (), reference: Callable[..., Any] | None = None,
           atol: float = 1e-6, **tune_options: Any) -> Any:
    """The Tessera-style kernel decorator (see the module docstring); usable bare or with arguments.

    :param tile_shape: fixed ``tile_size_x/y/z`` defines when they are not tuned.
    :param shared_memory: dynamic shared memory bytes (CUDA).
    :param num_warps: fixed block size ``32 * num_warps`` (CUDA) when ``block_size_x`` is not tuned; for
        Triton the ``num_warps`` launch option.
    :param autotune: tune on first use (else run the cached, hero or fixed config).
    :param autotune_configs: the configs to try (the search space when ``tune_params`` is not given).
    :param target: ``"cuda"``, ``"c"``/``"cpu"``, ``"opencl"`` or ``"triton"``.
    :param tune_params: Kernel Tuner's tunable parameters (name -> values).
    :param restrictions: Kernel Tuner's restrictions (strings or callables).
    :param heroes: known-good configs, measured first when tuning and run before any tuning.
    :param reference: ``reference(*args)`` -> Kernel Tuner's ``answer`` list for checking.
    :param tune_options: further ``tune_kernel`` options (``strategy``, ``strategy_options``, ``iterations``...).
    """
    if isinstance(shared_memory, bool) or not isinstance(shared_memory, int) or shared_memory < 0:
        raise InvalidArgumentError("shared_memory", shared_memory, "a non-negative number of bytes")
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps < 1:
        raise InvalidArgumentError("num_warps", num_warps, "a positive integer")
    fixed: dict[str, Any] = {}
    tgt = str(target).lower()
    if tgt == "cuda" or tgt == "opencl":
        fixed["block_size_x"] = 32 * num_warps
    elif tgt == "triton":
        fixed["num_warps"] = num_warps
    if tile_shape is not None:
        if not isinstance(tile_shape, (list, tuple)) or not 1 <= len(tile_shape) <= 3 or \
                not all(isinstance(t, int) and t > 0 for t in tile_shape):
            raise InvalidArgumentError("tile_shape", tile_shape, "1 to 3 positive ints")
        fixed.update({f"tile_size_{a}": t for a, t in zip("xyz", tile_shape)})

    def wrap(f: Callable[..., KernelLaunch]) -> TunableKernel:
        return TunableKernel(f, target=target, autotune=autotune, tune_params=tune_params,
                             autotune_configs=autotune_configs, restrictions=restrictions, heroes=list(heroes),
                             reference=reference, atol=atol, fixed=fixed, smem_bytes=shared_memory,
                             tune_options=tune_options)

    return wrap(fn) if fn is not None else wrap
