"""Array adapters: how Tracea reads shape/dtype/device from a user's array and allocates outputs of
the same kind, without importing any framework.

The core ships the NumPy adapter. Backends and integrations contribute more through the
``tracea_array_adapters`` hook (CuPy in ``tracea-cuda``, torch in ``tracea-torch``). Arrays of a kind
no adapter owns but which speak DLPack are still *described* (so the error can name their device),
but not run.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..dtypes import DType
from ..errors import DTypeError, InvalidArgumentError, UnsupportedDeviceError
from ..ir.device import Device

_HOST = Device("cpu", 0)
_addressof, _byte_at = ctypes.addressof, ctypes.c_byte.from_buffer

# DLPack device type codes (dlpack.h) -> Tracea device kinds.
DLPACK_DEVICE_KINDS = {1: "cpu", 2: "cuda", 3: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                       13: "cuda"}


def imported(name: str) -> Any:
    """``sys.modules[name]`` once its import has finished, else None -- never importing it. While another
    thread is still importing a framework (torch's import takes seconds), ``sys.modules`` already holds the
    partially initialized module, whose attributes (``torch.Tensor``) do not exist yet: a call that only asks
    "is this a torch tensor?" would raise AttributeError (seen: a tuning thread importing torch while another
    ran ``tracea.ops.matmul`` on NumPy arrays). No object can be a tensor of a module still initializing."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


@dataclass(frozen=True)
class ArrayInfo:
    """What Tracea knows of one array argument.

    :param shape: logical shape.
    :param strides: strides in elements (None when unknown).
    :param dtype: element dtype.
    :param device: where the data lives.
    :param adapter: name of the adapter that owns the array (``"numpy"``, ``"torch"``, ``"cupy"``).
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: DType
    device: Device
    adapter: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def c_contiguous(self) -> bool:
        """True when the strides are those of a packed row-major array (size-1 dims ignored)."""
        if self.strides is None:
            return False
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


class ArrayAdapter:
    """Base class for array adapters. Subclasses set :attr:`name` and implement the methods.

    ``priority``: higher is asked first (a torch adapter must outrank a generic DLPack one).
    """

    name: str = "abstract"
    priority: int = 0
    #: device kinds this adapter can allocate on (``from_numpy``); the tuner uses it to build inputs.
    device_kinds: tuple[str, ...] = ()
    #: the module whose import allocating needs (``"torch"``), or None: the tuner takes another adapter of
    #: the device while that module is not imported yet (see :func:`tracea.tuning.inputs.pick_adapter`)
    framework: str | None = None
    #: whether a framework computes ops on these arrays where Tracea does not (a ``tracea_fallback_run``
    #: implementation serves them: torch tensors). Variants that declined only because that framework measured
    #: faster (:class:`~tracea.doctor.decision.FrameworkFaster`) stay candidates for arrays of a kind without
    #: one (NumPy, CuPy): there is nothing faster to defer to, and the alternative is the reference oracle.
    framework_computes: bool = False

    def stores(self, dtype: DType) -> bool:
        """Whether :meth:`from_numpy` / :meth:`empty` hold ``dtype`` natively (the tuner builds its inputs
        with an adapter that does; default: NumPy has the dtype -- bfloat16 only with ``ml_dtypes``)."""
        return dtype.numpy is not None

    def owns(self, obj: Any) -> bool:
        """True when this adapter handles ``obj``'s type. Must not import a framework to decide."""
        raise NotImplementedError

    def info(self, obj: Any) -> ArrayInfo:
        """Describe ``obj``."""
        raise NotImplementedError

    def empty(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        """A new uninitialised array of ``shape``/``dtype`` of ``like``'s kind and device."""
        raise NotImplementedError

    def contiguous(self, obj: Any) -> Any:
        """``obj`` as a packed row-major array (a copy only when needed)."""
        raise NotImplementedError

    def empty_factory(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        """A function ``new(like)`` allocating what :meth:`empty` would for arrays with ``like``'s signature
        (the plan cache calls it on every call: adapters precompute what they can)."""
        shape = tuple(int(s) for s in shape)
        return lambda obj: self.empty(shape, dtype, obj)

    def swap_last(self, obj: Any) -> Any:
        """A view of ``obj`` with its last two axes swapped (no copy)."""
        raise NotImplementedError

    def channels_last_factory(self, shape: Sequence[int], dtype: DType, like: Any) -> Callable[[Any], Any] | None:
        """For array kinds that are logically NCHW (:attr:`logical_nchw`): a function ``new(like)``
        allocating an array of logical ``shape`` (N, C, H, W) whose memory is NHWC (torch's channels_last),
        so an NHWC kernel writes it in place; None (the default) when the kind has no such arrays."""
        return None

    #: True when arrays of this kind are logically NCHW whatever their memory order (torch's
    #: channels_last tensors); conv2d then infers NHWC from the strides.
    logical_nchw: bool = False

    def permute(self, obj: Any, axes: Sequence[int]) -> Any:
        """A view of ``obj`` with its axes permuted (no copy)."""
        return obj.transpose(tuple(axes))

    def astype(self, obj: Any, dtype: DType) -> Any:
        """``obj`` converted to ``dtype`` (``obj`` itself when it already has it)."""
        if self.info(obj).dtype is dtype:
            return obj
        return obj.astype(dtype.numpy)

    def direct_fallback(self, op: Any, like: Any) -> Callable[..., Any] | None:
        """A function ``compute(x, w, bias)`` doing ``op`` with the framework's own call on the arrays as the
        user passed them (no output given); ``like``: the first call's input. For a conv no Tracea kernel
        serves the plan cache calls it directly instead of the ``tracea_fallback_run`` hook (fewer frames on a
        path that competes with the framework's own call); first-use tuning times it against Tracea's choice
        (:meth:`arbitrate`). None (the default): the hook runs, and first-use tuning has no framework side."""
        return None

    def direct_attention(self, op: Any, q: Any, k: Any, v: Any, mask: Any) -> Callable[..., Any] | None:
        """For an attention signature no Tracea kernel serves: a function ``compute(q, k, v, mask)`` doing ``op``
        with the framework's own call on the arrays as the user passed them, decided once on the first call's
        arrays (``tracea.ops.attention`` then calls it directly instead of the ``tracea_fallback_run`` hook).
        None (the default, or where the arrays need adapting first): the hook runs."""
        return None

    def arbitrate(self, decision: Any, ours: Callable[..., Any], theirs: Callable[..., Any],
                  args: tuple) -> tuple[str, ...] | None:
        """First-use tuning's last question (``tracea.set_tuning("first-use")``): time ``ours(*args)`` (the plan
        Tracea would run for ``decision``) against ``theirs(*args)`` (the framework's own call, from
        :meth:`direct_fallback`) on the first call's arrays, compare the outputs, and return ``(winner,
        reason)`` with winner ``"tracea"`` or ``"framework"``, or ``(winner, reason, captured_winner)`` where
        calls captured in CUDA graphs (device time only) have their own winner (persisting the verdict is the
        adapter's business); None (the default): no opinion, Tracea serves -- unless the Doctor kept the
        variant only for this check (``Candidate.framework_faster``), then the framework does."""
        return None

    def structured_mask(self, obj: Any, like: Any) -> tuple[str, int, int, Any] | None:
        """For an attention mask object that describes its mask instead of holding it (torch's
        ``CausalBias``, whose tensor data mean nothing): ``(alignment, seq_q, seq_kv, mask)`` with alignment
        ``"upper_left"`` (key j visible to query i when j <= i) or ``"lower_right"`` (j <= i + seq_kv -
        seq_q), and ``mask`` the same as a boolean (seq_q, seq_kv) array on ``like``'s device; None (the
        default) for an array holding its mask. Such objects have no plan-cache signature (:meth:`owns`
        is False for them)."""
        return None

    def allows_fallback_only(self) -> bool:
        """Whether a fallback-only variant (the NumPy reference) may serve arrays of this kind. An
        integration with a faster framework fallback (torch) returns False so dispatch asks the
        ``tracea_fallback_run`` hook first."""
        return True

    def fp32_precision(self) -> Any:
        """The framework's float32 matmul precision for arrays of this kind (None = Tracea's default,
        ``Fp32Precision.HIGHEST``). The torch adapter follows ``torch.get_float32_matmul_precision()``."""
        return None

    def conv_fp32_precision(self, obj: Any) -> Any:
        """The framework's float32 precision for a convolution on ``obj`` (None = Tracea's default). The
        same as :meth:`fp32_precision` unless the framework has its own rule for convolutions (torch:
        ``torch.backends.cudnn.allow_tf32`` on CUDA, on by default, as ``F.conv2d`` uses it)."""
        return self.fp32_precision()

    def framework_state(self) -> Any:
        """Everything of the framework's global state that :meth:`fp32_precision` and
        :meth:`conv_fp32_precision` read, as one hashable value: part of every cached plan's key, so a
        change (``torch.set_float32_matmul_precision``, ``cudnn.allow_tf32``) selects another plan."""
        return self.fp32_precision()

    def reshape(self, obj: Any, shape: Sequence[int]) -> Any:
        """A view of a contiguous ``obj`` with a new shape."""
        return obj.reshape(tuple(shape))

    def to_numpy(self, obj: Any) -> np.ndarray:
        """A NumPy view (zero-copy) of a host array; raises for device memory."""
        raise UnsupportedDeviceError(f"{self.name} arrays on {self.info(obj).device} have no host view")

    def host_bits(self, obj: Any) -> np.ndarray:
        """A zero-copy NumPy view of a host array's raw bits as unsigned integers of its item size
        (``uint16`` for bf16/fp16), for kernels that read dtypes NumPy lacks without ml_dtypes.
        Raises like :meth:`to_numpy` where there is no host view."""
        arr = self.to_numpy(obj)
        return arr.view(f"u{arr.dtype.itemsize}")

    def from_numpy(self, arr: np.ndarray, device: Device) -> Any:
        """A new array of this adapter's kind on ``device`` holding a copy of ``arr``."""
        raise UnsupportedDeviceError(f"the {self.name} adapter cannot allocate on {device}")

    def to_host(self, obj: Any) -> np.ndarray:
        """A NumPy copy of ``obj`` wherever it lives (synchronizes device work)."""
        return np.array(self.to_numpy(obj))

    def copy_(self, dst: Any, src: Any) -> None:
        """Copy ``src`` (same adapter) into ``dst`` elementwise."""
        dst[...] = src

    def write_error(self, obj: Any) -> str | None:
        """Why ``obj`` cannot be written as an ``out=`` argument (read-only memory, a tensor autograd
        tracks ...), or None when it can."""
        return None

    def memory_span(self, obj: Any) -> tuple[int, int] | None:
        """``(first, end)`` byte addresses of the memory ``obj``'s elements lie in, or None when unknown
        (or empty); ``tracea.ops`` refuses an ``out`` whose span meets an input's."""
        return None

    def may_overlap(self, out: Any, other: Any) -> bool:
        """Whether ``out`` may share memory with ``other`` (an input of the same call, or None): their
        :meth:`memory_span` ranges meet. Called on every call that passes ``out``."""
        if other is None or not self.owns(other):
            return False
        a, b = self.memory_span(out), self.memory_span(other)
        return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]

    #: optional: a function ``f(obj) -> int`` returning what :meth:`data_ptr` does without the adapter's frame
    #: (the array type's own method), for launchers' hot paths; None: they call :meth:`data_ptr`
    raw_data_ptr: Callable[[Any], int] | None = None

    def data_ptr(self, obj: Any) -> int:
        """The address of ``obj``'s first element (host memory for host arrays, device memory for
        device arrays), for launchers; called on every call."""
        return int(self.to_numpy(obj).__array_interface__["data"][0])

    def signature(self, obj: Any) -> Any:
        """A cheap hashable description of everything about ``obj`` that dispatch decisions depend on
        (shape, strides, dtype, device), for the plan cache; None when there is none (every call then
        takes the full path). Called on every call: keep it to a few attribute reads."""
        return None

    def version(self, obj: Any) -> Any:
        """A token that changes whenever ``obj``'s elements are written in place (torch: the tensor's
        version counter), or None when the framework keeps none. Plans may then reuse what they derived
        from ``obj`` (a converted attention mask) while the same object keeps the same token; None means
        nothing is reused."""
        return None

    def capturing(self, obj: Any) -> bool:
        """Whether work queued for ``obj`` now is being recorded for later replay (a CUDA graph capture on
        its device's current stream): derived arrays must then be recomputed inside the recording, since
        the replays see the inputs' contents at replay time."""
        return False


class NumpyAdapter(ArrayAdapter):
    """NumPy ndarrays (always ``cpu:0``)."""

    name = "numpy"
    priority = 10
    device_kinds = ("cpu",)

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray)

    def info(self, obj: np.ndarray) -> ArrayInfo:
        try:
            dtype = DType.parse(obj.dtype)
        except DTypeError:
            dtype = None  # type: ignore[assignment]
        if dtype is None:
            raise DTypeError("dtype", obj.dtype, "float64, float32, float16 or int8 (NumPy)")
        item = obj.itemsize
        strides = tuple(s // item for s in obj.strides) if all(s % item == 0 for s in obj.strides) else None
        return ArrayInfo(obj.shape, strides, dtype, _HOST, self.name)

    def empty(self, shape: Sequence[int], dtype: DType, like: Any) -> np.ndarray:
        np_dtype = dtype.numpy
        if np_dtype is None:
            raise DTypeError("out_dtype", dtype.value, "a dtype NumPy can store (install ml_dtypes for bf16/fp8)")
        return np.empty(tuple(shape), dtype=np_dtype)

    def contiguous(self, obj: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(obj)

    def empty_factory(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        shape, np_dtype, empty = tuple(int(s) for s in shape), dtype.numpy, np.empty
        if np_dtype is None:
            return super().empty_factory(shape, dtype, like)
        return lambda obj: empty(shape, np_dtype)

    def swap_last(self, obj: np.ndarray) -> np.ndarray:
        return np.swapaxes(obj, -1, -2)

    def to_numpy(self, obj: np.ndarray) -> np.ndarray:
        return obj

    def write_error(self, obj: np.ndarray) -> str | None:
        return None if obj.flags.writeable else "it is read-only (writeable=False, e.g. a read-only memmap)"

    def may_overlap(self, out: np.ndarray, other: Any) -> bool:
        return isinstance(other, np.ndarray) and np.may_share_memory(out, other)

    def signature(self, obj: np.ndarray) -> Any:
        return obj.shape, obj.strides, obj.dtype

    def data_ptr(self, obj: np.ndarray) -> int:
        try:  # ~0.2 us; __array_interface__ builds a dict (~1 us)
            return _addressof(_byte_at(obj))  # type: ignore[arg-type]
        except (TypeError, ValueError):  # read-only or non-contiguous memory
            return int(obj.__array_interface__["data"][0])

    def from_numpy(self, arr: np.ndarray, device: Device) -> np.ndarray:
        if device.kind != "cpu":
            raise UnsupportedDeviceError(f"NumPy arrays live on the host, not {device}")
        return np.array(arr, copy=True)


class DLPackAdapter(ArrayAdapter):
    """Describes any DLPack-capable array; host ones run through a NumPy view, device ones are
    reported as unsupported. Lowest priority: framework adapters from plugins take precedence."""

    name = "dlpack"
    priority = -100

    def owns(self, obj: Any) -> bool:
        return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")

    def info(self, obj: Any) -> ArrayInfo:
        dev_type, dev_id = obj.__dlpack_device__()
        kind = DLPACK_DEVICE_KINDS.get(int(dev_type), f"dlpack{int(dev_type)}")
        shape = tuple(int(s) for s in getattr(obj, "shape", ()))
        return ArrayInfo(shape, None, DType.parse(getattr(obj, "dtype", None), arg="dtype"),
                         Device(kind, int(dev_id)), self.name)


def builtin_adapters() -> list[ArrayAdapter]:
    return [NumpyAdapter(), DLPackAdapter()]


def find_adapter(obj: Any, adapters: Sequence[ArrayAdapter], arg: str) -> ArrayAdapter:
    """The first adapter (``adapters`` are in descending priority) owning ``obj``, or a specific error."""
    for adapter in adapters:
        if adapter.owns(obj):
            return adapter
    hint = ""
    module = type(obj).__module__.split(".")[0]
    if module == "torch":
        hint = "torch tensors need the tracea-torch package: pip install tracea-torch"
    elif module == "cupy":
        hint = "CuPy arrays need the tracea-cuda package: pip install tracea-cuda"
    raise InvalidArgumentError(arg, obj, "a NumPy array or an array kind an installed backend supports",
                               hint=hint)
