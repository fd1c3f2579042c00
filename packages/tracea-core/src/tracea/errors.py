"""The one exception and warning hierarchy of Tracea.

Every error a user can trigger is a :class:`TraceaError`. Argument errors name the argument, the value
that was given and what was expected, so a message alone tells the user what to change.

Every warning Tracea emits is a :class:`TraceaWarning`, so one filter silences or escalates them all::

    warnings.filterwarnings("ignore", category=tracea.errors.TraceaWarning)   # or "error"
"""

from __future__ import annotations

from typing import Any


class TraceaError(Exception):
    """Base class of every error raised by Tracea."""


class InvalidArgumentError(TraceaError, ValueError):
    """An argument has a value Tracea cannot accept.

    :param arg: the argument's name as the user wrote it (``"a"``, ``"stride"``, ``"m"``).
    :param value: the value that was given (shown with ``repr``; arrays show shape and dtype).
    :param expected: what would have been accepted, in words.
    """

    def __init__(self, arg: str, value: Any, expected: str, *, hint: str = "") -> None:
        self.arg = arg
        self.value = value
        self.expected = expected
        self.hint = hint
        msg = f"argument '{arg}': got {_show(value)}, expected {expected}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class ShapeError(InvalidArgumentError):
    """Shapes are inconsistent with each other, have the wrong rank, or hold zero/negative sizes."""


class DTypeError(InvalidArgumentError, TypeError):
    """A dtype is unknown, unsupported by the operation, or differs between operands that must agree."""


class LayoutError(InvalidArgumentError):
    """A memory layout (strides, layout name) cannot be served."""


class UnsupportedDeviceError(TraceaError):
    """The arrays live on a device that no installed backend serves (for example CUDA arrays with no
    ``tracea-cuda`` installed), or operands live on different devices."""


class UnsupportedConfigError(TraceaError):
    """A :class:`~tracea.semantic.config.PipelineConfig` is invalid for a variant or device; ``reason`` says why."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        self.reason = reason or message
        super().__init__(message)


class NoVariantError(TraceaError):
    """No registered kernel variant accepts an operation; ``rejections`` maps variant name to reasons."""

    def __init__(self, message: str, rejections: dict[str, list[str]] | None = None) -> None:
        self.rejections = dict(rejections or {})
        lines = [message]
        for name, reasons in self.rejections.items():
            lines.append(f"  - {name}: {'; '.join(reasons)}")
        super().__init__("\n".join(lines))


class BackendError(TraceaError, RuntimeError):
    """A backend failed to compile, load or run a kernel. ``backend`` names it; ``log`` holds tool output."""

    def __init__(self, message: str, *, backend: str = "", log: str = "") -> None:
        self.backend = backend
        self.log = log
        text = f"[{backend}] {message}" if backend else message
        if log:
            text += "\n--- log ---\n" + log.rstrip()
        super().__init__(text)


class CompilationError(BackendError):
    """Kernel source failed to compile; ``log`` holds the compiler's output."""


class LaunchError(BackendError):
    """A compiled kernel failed to launch or run."""


class CaptureError(LaunchError):
    """A launch cannot happen *now*: it would need a step that is illegal while its stream captures a
    CUDA graph (compiling or loading a kernel on the first call of a signature). Refused before the
    stream was touched, so the capture stays valid; the same call outside a capture works."""


class CacheError(TraceaError):
    """The tuning cache cannot be read or written (the message names the file and what was done)."""


class UnsupportedOptionError(TraceaError, ValueError):
    """An option of :func:`tracea.tune_kernel` / :func:`tracea.run_kernel` that Tracea does not
    support (or an unknown one); ``option`` names it."""

    def __init__(self, option: str, why: str) -> None:
        self.option = option
        super().__init__(f"option {option!r}: {why}")


class VerificationError(TraceaError, RuntimeError):
    """A user kernel's output differs from the ``answer`` it was checked against (Kernel Tuner raises
    a RuntimeError here too); the message names the config, the argument and the largest error."""


class PluginError(TraceaError):
    """A plugin could not be loaded or violates the hook contract."""


class TraceaWarning(UserWarning):
    """Base class of every warning Tracea emits."""


class TuningCacheWarning(TraceaWarning):
    """A tuning-cache file or entry was unusable and was set aside or ignored (results stay correct)."""


class FallbackWarning(TraceaWarning):
    """A framework fallback computed an op Tracea has no kernel for (opt-in: ``TRACEA_WARN_FALLBACK=1``)."""


class ReferenceBackendWarning(TraceaWarning):
    """No compute backend is installed for the device: calls run on the NumPy reference backend in the
    core. Emitted once per process and device kind; the message names the package to install."""


class SamplerFallbackWarning(TraceaWarning):
    """The requested tuning sampler cannot run here (a dependency is missing); another one is used."""


class KernelFailureWarning(TraceaWarning, RuntimeWarning):
    """A kernel failed at run time; the call was computed by the next candidate or by the framework."""


class ResultMismatchWarning(TraceaWarning, RuntimeWarning):
    """A Tracea kernel's result differed from the framework's; the framework computes that signature."""


class BusyMachineWarning(TraceaWarning, RuntimeWarning):
    """Tuning ran while other processes kept the CPU busy, so the timings may mislead."""


class VersionWarning(TraceaWarning, RuntimeWarning):
    """An integrated library (torch) is newer than the versions Tracea was tested with."""


def _show(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, (int, float, str)):
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
