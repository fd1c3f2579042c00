"""Every Tracea hook, in one module. The docstrings are the contract.

A plugin is a module (or object) with functions named like the specs below and decorated with
``tracea.plugins.hookimpl``. Plugins may implement any subset, and an implementation may accept a
subset of a hook's arguments. New arguments are only ever appended to a spec.

Plugins are found from the ``tracea`` entry-point group and from the ``TRACEA_PLUGINS`` environment
variable (see :mod:`tracea.plugins.manager`).

List-returning hooks are called on every plugin and their lists are concatenated. For hooks marked
*firstresult*, plugins are called until one returns something other than None: "Stops at first
non-None result".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from ..doctor.profile import DeviceProfile
    from ..doctor.variant import KernelVariant, OpArgs
    from ..ir.device import Device
    from ..ir.ops import Op
    from ..runtime.arrays import ArrayAdapter
    from ..semantic.config import PipelineConfig
    from ..semantic.search_space import SearchSpace
    from .backend_info import BackendInfo

PROJECT = "tracea"
hookspec = pluggy.HookspecMarker(PROJECT)


# ------------------------------------------------------------------------------------------------
# Registration: what a backend brings
# ------------------------------------------------------------------------------------------------

@hookspec
def tracea_backend_info() -> "BackendInfo | list[BackendInfo] | None":
    """Describe the backend(s) this plugin provides, for ``tracea doctor`` and version checks.

    Implemented by every backend plugin. Called once per process (cached by the Doctor).

    :returns: a :class:`~tracea.plugins.backend_info.BackendInfo` (or a list of them) naming the
        backend, its version, whether it is usable here and, if not, why ("no C compiler found",
        "cupy is not installed: pip install tracea-cuda[cuda13]"). A backend whose toolkit is missing
        must still return its info with ``available=False`` rather than raise.
    """


@hookspec
def tracea_register_variants() -> "list[KernelVariant] | None":
    """Register kernel variants.

    Implemented by backends. Called once per process (the Doctor caches the registry); results of all
    plugins are concatenated. Variant names must be unique across plugins: a duplicate name is a
    :class:`~tracea.errors.PluginError`.

    :returns: a list of :class:`~tracea.doctor.variant.KernelVariant` instances. Return the variants
        even when the toolkit is missing only if their ``check`` then rejects every op with the reason;
        otherwise return an empty list.
    """


@hookspec
def tracea_device_profiles() -> "list[DeviceProfile] | None":
    """Contribute device profiles to the Doctor's capability profiler.

    Implemented by backends that discover devices (CUDA GPUs, OpenCL devices); the core contributes the
    host CPU itself. Called once per process; results are concatenated. Must not raise when no device or
    runtime is present: return an empty list.

    :returns: a list of :class:`~tracea.doctor.profile.DeviceProfile`. When two plugins profile the same
        device, the first registered profile for a ``Device`` wins; backends that refine the host CPU
        profile should instead put their details in the variants' checks.
    """


@hookspec
def tracea_array_adapters() -> "list[ArrayAdapter] | None":
    """Contribute array adapters so ops accept more array kinds (CuPy arrays, torch tensors).

    Implemented by backends and integrations. Called once per process; results are concatenated and
    asked in descending ``priority``.

    :returns: a list of :class:`~tracea.runtime.arrays.ArrayAdapter` instances.
    """


# ------------------------------------------------------------------------------------------------
# Tuning: what may be tried
# ------------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def tracea_search_space(variant: "KernelVariant", op: "Op", profile: "DeviceProfile") -> "SearchSpace | None":
    """Supply the search space a tuner explores for ``variant`` on ``op`` and ``profile``.

    Implemented by the backend owning the variant, or by a site plugin that wants to narrow or widen a
    space. The core's fallback implementation (called last) returns ``variant.search_space(op, profile)``.
    Stops at first non-None result.

    :param variant: the variant being tuned.
    :param op: the operation (its shape matters: small problems want small tiles).
    :param profile: the device profile.
    :returns: a :class:`~tracea.semantic.search_space.SearchSpace`, or None to defer to other plugins.
    """


@hookspec
def tracea_hero_configs(variant: "KernelVariant", op: "Op", profile: "DeviceProfile") -> "list[PipelineConfig] | None":
    """Supply known-good ("hero") configs for ``variant`` on ``op`` and ``profile``.

    Implemented by the backend owning the variant; any plugin may add configs for any variant. All
    results are concatenated, plugins registered later first, the core fallback
    (``variant.hero_configs``) last; duplicates are dropped. The tuner enqueues them before searching,
    and dispatch runs the first valid one when nothing is tuned.

    :returns: a list of :class:`~tracea.semantic.config.PipelineConfig` (best first), or None.
    """


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def tracea_prepare_variant(variant: "KernelVariant", op: "Op", config: "PipelineConfig",
                           profile: "DeviceProfile") -> Any:
    """Compile or load what running ``variant`` with ``config`` needs, so it is not timed later.

    Implemented by the backend owning the variant (others return None). The core fallback calls
    ``variant.prepare`` and returns ``True``. Errors raise :class:`~tracea.errors.CompilationError`
    with the compiler log. Stops at first non-None result.

    :returns: any non-None value once prepared (a compiled-kernel handle, or True).
    """


@hookspec(firstresult=True)
def tracea_run_variant(variant: "KernelVariant", op: "Op", config: "PipelineConfig", args: "OpArgs",
                       profile: "DeviceProfile") -> Any:
    """Run ``variant`` with ``config`` on the arrays in ``args``, writing ``args.out``.

    Implemented by the backend owning the variant; a plugin returns None for variants it does not own
    (check ``variant.backend``). The core fallback, called last, runs ``variant.run(...)`` and returns
    True. Launches on the caller's current stream where the device has streams; need not synchronize.
    Failures raise :class:`~tracea.errors.BackendError` (or a subclass); the CUDA context or compiler
    state must stay usable afterwards. Stops at first non-None result.

    :returns: any non-None value (True) once the work has been issued.
    """


@hookspec(firstresult=True)
def tracea_bind_variant(variant: "KernelVariant", op: "Op", config: "PipelineConfig", profile: "DeviceProfile",
                        adapter: "ArrayAdapter") -> Any:
    """Bind ``variant`` with ``config`` for ``op`` into a launcher for the plan cache.

    Called once per call signature, after ``tracea_prepare_variant``. The launcher is called on every
    later call with that signature as ``launch(*inputs, out)``: the input arrays in ``op.roles`` order
    (``a, b, bias`` / ``x, w, bias`` / ``q, k, v``; absent ones None), packed as :class:`OpArgs`
    describes, then the output. It must do no per-call work that depends only on the signature
    (parse the config, render, look up kernels), must not synchronize, allocate only through
    ``adapter`` or the framework's stream-ordered allocator, and raise like ``tracea_run_variant``.
    A launcher that reads nothing of its arrays but their data addresses may say so with an attribute
    ``pointer_only = True``: callers may then pass any array with the same memory (a channels_last
    tensor for an NHWC operand, an (..., k) tensor for an (m, k) one) and skip building views.
    Implemented by backends that can launch faster than through ``tracea_run_variant``; the core
    fallback (called last) returns ``variant.bind(...)`` or, when that is None or another plugin
    intercepts ``tracea_run_variant``, a launcher that calls ``tracea_run_variant`` each time.
    Stops at first non-None result.

    :param adapter: the :class:`~tracea.runtime.arrays.ArrayAdapter` owning the arrays.
    :returns: a callable ``launch(*inputs, out) -> None``.
    """


@hookspec(firstresult=True)
def tracea_measure(variant: "KernelVariant", op: "Op", config: "PipelineConfig", args: "OpArgs",
                   profile: "DeviceProfile", warmup: int, repeats: int) -> "list[float] | None":
    """Time ``repeats`` runs of ``variant`` with ``config`` on ``args`` after ``warmup`` untimed runs.

    Implemented by backends with precise device timers (CUDA events, OpenCL profiling events) for
    their own variants; others return None. The core fallback (called last) times with
    ``time.perf_counter`` around each run followed by ``tracea_synchronize``. The tuner is responsible
    for rotating inputs / flushing caches between calls. Stops at first non-None result.

    :returns: the per-run times in seconds (length ``repeats``).
    """


@hookspec(firstresult=True)
def tracea_fallback_run(op: "Op", arrays: "dict[str, Any]", out: Any, reason: str) -> Any:
    """Compute ``op`` outside Tracea when no variant serves it (for example with PyTorch itself).

    Implemented by framework integrations (``tracea-torch``) for the array kinds they own; others return
    None. Called by dispatch only after the Doctor rejected every variant; ``reason`` is the Doctor's
    summary, recorded in the fallback counters that ``tracea doctor`` shows.
    Stops at first non-None result.

    :param op: the operation.
    :param arrays: the input arrays by role as the user passed them (``a``, ``b``, ``bias`` ...).
    :param out: the output array the user passed, or None.
    :returns: the result array (``out`` when given), or None when this plugin does not handle the arrays.
    """


@hookspec
def tracea_synchronize(device: "Device") -> None:
    """Block until all work Tracea issued on ``device`` has finished.

    Implemented by backends with asynchronous devices (CUDA, OpenCL); called on every plugin by
    ``Context.synchronize``. Plugins ignore devices of other kinds.
    """


@hookspec
def tracea_environment(profile: "DeviceProfile") -> "dict[str, str] | None":
    """Extra facts that make a tuned result valid on ``profile``, merged into the tuning-cache fingerprint.

    Implemented by backends for their devices (compiler version, NVRTC/CuPy version, OpenCL driver);
    return None for other devices. Results of all plugins are merged (later keys do not override).

    :returns: a dict of short string keys to string values.
    """


@hookspec
def tracea_perf_data(profile: "DeviceProfile") -> "list[str] | None":
    """Performance-model data files (JSON, see :mod:`tracea.perfmodel.data`) a backend ships for
    ``profile``'s device kind: measured times of its variants' default configs on many shapes, one
    file per architecture. The Doctor uses the files whose ``arch_key`` matches the device
    (:func:`tracea.perfmodel.arch_key`); a malformed file is skipped with a reason, never fatal.

    Implemented by backends that ship measured data (tracea-cuda, tracea-cpu); results of all plugins
    are concatenated.

    :param profile: the device whose decisions the model ranks (its ``device.kind`` says whether the
        backend's files apply).
    :returns: file paths, or None for devices of other kinds.
    """


# ------------------------------------------------------------------------------------------------
# User kernels: tracea.tune_kernel / run_kernel / @tracea.kernel
# ------------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def tracea_kernel_runner(lang: str, device: Any, options: "dict[str, Any]") -> Any:
    """A runner that compiles, launches and times *user* kernels written in ``lang``.

    Implemented by backends for the languages they launch: ``tracea-cpu`` for ``"C"`` (the system
    C/C++ compiler, Kernel Tuner's convention of C functions returning their own time in ms),
    ``tracea-cuda`` for ``"CUDA"`` (CuPy/NVRTC) and ``"TRITON"``, ``tracea-opencl`` for ``"OPENCL"``.
    Others return None. Called by :func:`tracea.tune_kernel` once per call; the runner must follow
    :class:`tracea.usertune.runner.KernelRunner`. A backend whose toolkit is missing raises
    :class:`~tracea.errors.UnsupportedDeviceError` saying what to install instead of returning None.
    Stops at first non-None result.

    :param lang: the upper-case language name (``"C"``, ``"CUDA"``, ``"OPENCL"``, ``"TRITON"``).
    :param device: the device index (Kernel Tuner's ``device`` option, an int) or None for the default.
    :param options: runner options of the call: ``platform`` (OpenCL platform index), ``compiler``
        (C: the compiler command, default ``$CXX`` else ``g++``/``c++``/``clang++``).
    :returns: a :class:`~tracea.usertune.runner.KernelRunner`, or None when this plugin does not launch
        ``lang``.
    """
