"""The torch array adapter: lets ``tracea.ops`` accept ``torch.Tensor`` on CPU and CUDA, zero-copy.

Host tensors reach NumPy-based backends as zero-copy NumPy views (``Tensor.numpy()``); bfloat16 and
fp8 views need ``ml_dtypes`` (the bits are reinterpreted, still zero-copy), otherwise
:meth:`TorchAdapter.to_numpy` raises a :class:`~tracea.errors.DTypeError` saying so. CUDA tensors are
handed to the CUDA backend as they are (it reads them through the CUDA array interface / DLPack) and
:meth:`TorchAdapter.cuda_stream` gives torch's current stream so kernels launch in torch's order.
Outputs are allocated by torch (:meth:`TorchAdapter.empty`) on the inputs' device.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Sequence

import numpy as np

from tracea.dtypes import DType
from tracea.errors import DTypeError, UnsupportedDeviceError
from tracea.ir.device import Device
from tracea.runtime.arrays import ArrayAdapter, ArrayInfo
from tracea.runtime.arrays import imported

# Tracea dtype -> torch dtype attribute name.
_TORCH_DTYPE_NAMES = {DType.F64: "float64", DType.F32: "float32", DType.TF32: "float32",
                      DType.F16: "float16", DType.BF16: "bfloat16", DType.FP8_E4M3: "float8_e4m3fn",
                      DType.FP8_E5M2: "float8_e5m2", DType.INT8: "int8", DType.INT32: "int32"}
# Same-size integer types used to reinterpret dtypes NumPy lacks (bits unchanged).
_BIT_VIEWS = {DType.BF16: "int16", DType.FP8_E4M3: "int8", DType.FP8_E5M2: "int8"}


def torch_dtype(dtype: DType) -> Any:
    """The ``torch.dtype`` storing ``dtype`` (TF32 is stored as float32)."""
    found = _TO_TORCH.get(dtype)
    if found is None:
        import torch

        found = _TO_TORCH[dtype] = getattr(torch, _TORCH_DTYPE_NAMES[DType.parse(dtype)])
    return found


def _empty_strides(shape: tuple[int, ...], **kw: Any) -> tuple[int, ...]:
    """The strides ``torch.empty(shape, **kw)`` gives (a meta tensor: no memory)."""
    import torch

    return tuple(torch.empty(shape, device="meta", **kw).stride())


_TO_TORCH: dict[Any, Any] = {}
_INT_VIEWS: dict[Any, Any] = {}  # torch.dtype -> (same-size torch int dtype, NumPy unsigned dtype)


def _causal_bias(obj: Any) -> tuple[str, int, int] | None:
    """``(alignment, seq_q, seq_kv)`` of a ``torch.nn.attention.bias.CausalBias``, else None."""
    if type(obj).__name__ != "CausalBias":  # (cheap: no import for plain tensors)
        return None
    bias_mod = sys.modules.get("torch.nn.attention.bias")
    if bias_mod is None or not isinstance(obj, bias_mod.CausalBias):
        return None
    lower = obj.variant == bias_mod.CausalVariant.LOWER_RIGHT
    return ("lower_right" if lower else "upper_left"), int(obj.seq_len_q), int(obj.seq_len_kv)


def causal_bias_mask(obj: Any, like: Any) -> tuple[str, int, int, Any] | None:
    """For a ``CausalBias``: ``(alignment, seq_q, seq_kv, the boolean (seq_q, seq_kv) mask on like's
    device)``; None for anything else."""
    found = _causal_bias(obj)
    if found is None:
        return None
    import torch

    align, sq, sk = found
    ones = torch.ones(sq, sk, dtype=torch.bool, device=like.device)
    return align, sq, sk, ones.tril(sk - sq if align == "lower_right" else 0)


_CPU = Device.cpu()
_DEVICES: dict[tuple[str, int], Device] = {}
_DTYPES: dict[Any, DType] = {}  # torch.dtype -> DType (parsing the name each call costs microseconds)


def tracea_device(t: Any) -> Device:
    """The Tracea :class:`Device` of tensor ``t``."""
    return device_of(t.device)


def device_of(dev: Any) -> Device:
    """The Tracea :class:`Device` of a ``torch.device`` (``cuda`` without an index: the current one)."""
    if dev.type == "cpu":
        return _CPU
    index = dev.index
    if index is None and dev.type == "cuda":
        import torch

        index = torch.cuda.current_device()
    key = (dev.type, int(index or 0))
    found = _DEVICES.get(key)
    if found is None:
        found = _DEVICES[key] = Device(*key)
    return found


def tracea_dtype(torch_dtype_: Any) -> DType:
    """The :class:`DType` of a ``torch.dtype`` (raises :class:`DTypeError` naming it when unknown)."""
    found = _DTYPES.get(torch_dtype_)
    if found is None:
        found = _DTYPES[torch_dtype_] = DType.parse(torch_dtype_, arg="dtype")
    return found


@functools.lru_cache(maxsize=1)
def stream_capturing() -> Any:
    """torch's cheapest query whether the current CUDA stream is capturing a CUDA graph (a C function of no
    arguments: ``torch._C._cuda_isCurrentStreamCapturing``, or the public wrapper where that is missing);
    resolved once (:meth:`TorchAdapter.capturing` asks it on every call of a plan that routes captured calls)."""
    import torch

    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def _matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()`` (bound on first use, to :mod:`tracea_torch.torch_flags`'
    getter: this runs on every call's key)."""
    global _matmul_precision
    from .torch_flags import matmul_precision

    _matmul_precision = matmul_precision  # type: ignore[assignment]
    return _matmul_precision()


def _cudnn_tf32() -> bool:
    """``torch.backends.cudnn.allow_tf32`` (bound on first use, as :func:`_matmul_precision`)."""
    global _cudnn_tf32
    from .torch_flags import cudnn_allow_tf32

    _cudnn_tf32 = cudnn_allow_tf32  # type: ignore[assignment]
    return bool(_cudnn_tf32())


class TorchAdapter(ArrayAdapter):
    """``torch.Tensor`` (and subclasses such as ``nn.Parameter``) on ``cpu`` and ``cuda``."""

    name = "torch"
    priority = 100
    device_kinds = ("cpu", "cuda")
    framework = "torch"
    framework_computes = True  # (PyTorch, through tracea_torch.plugin.tracea_fallback_run)
    #: torch tensors are logically NCHW whatever their memory format; channels_last selects NHWC kernels.
    logical_nchw = True

    def direct_fallback(self, op: Any, like: Any) -> Any:
        """CUDA tensors, conv2d or matmul with at most a bias and one activation, float32 at PyTorch's own
        precision (a conv at ``highest`` needs cuDNN's TF32 off: the hook does that); CPU tensors, a float32 NCHW
        conv2d (:func:`_cpu_conv_direct`): ``F.conv2d`` (+ the activation) itself, the call the hook would make (same kernels, same output memory format) without its
        frames (the hook path rebuilds the op, converts and allocates per call: wide grouped convs left to cuDNN
        measured 0.29-0.63x PyTorch through it on an H100 host, eager, device time equal); for matmul see
        :func:`_direct_matmul`."""
        from tracea.dtypes import Fp32Precision
        from tracea.ir.ops import Conv2dOp, GemmOp

        if isinstance(op, GemmOp) and getattr(like, "is_cuda", False):
            return _direct_matmul(op, like)
        if not isinstance(op, Conv2dOp):
            return None
        cuda = getattr(like, "is_cuda", False)
        if cuda and getattr(op, "fp32_precision", None) is Fp32Precision.HIGHEST and str(like.dtype) == "torch.float32":
            return None
        if not cuda and not _cpu_conv_direct(op, like):
            return None
        epilogue = _bias_activation(op)
        if epilogue is None:
            return None
        import torch.nn.functional as F

        conv, act = F.conv2d, epilogue[1]
        stride, padding, dilation, groups = op.stride, op.padding, op.dilation, op.groups
        if not cuda:  # a weight in another memory format takes the hook's path (see _cpu_conv_direct)
            from .eager import conv2d as hook_conv

            def compute(x: Any, w: Any, bias: Any) -> Any:
                if not w.is_contiguous():
                    return hook_conv(op, x, w, bias)
                out = conv(x, w, bias, stride, padding, dilation, groups)
                return out if act is None else act(out)

            return compute
        if act is None:
            return lambda x, w, bias: conv(x, w, bias, stride, padding, dilation, groups)
        return lambda x, w, bias: act(conv(x, w, bias, stride, padding, dilation, groups))

    def direct_attention(self, op: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
        """PyTorch's SDPA on the user's tensors, with nothing rebuilt per call (see
        :func:`tracea_torch.eager.direct_attention`; 2-core Zen 4 VM, bf16 decode attention declined on AMX
        CPUs: the fallback hook's frames and copies cost 18 us a call next to SDPA's 14 us)."""
        import torch

        from . import eager

        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or not (mask is None or type(mask) is torch.Tensor):
            return None
        return eager.direct_attention(op, q, k, v, mask)

    def arbitrate(self, decision: Any, ours: Any, theirs: Any, args: tuple) -> tuple[str, ...] | None:
        """First-use tuning's framework check on torch tensors: :func:`tracea_torch.arbiter.judge` (interleaved
        timing, outputs compared, the verdict persisted in the tuning cache like a patched layer's). Eager
        calls follow its eager winner, calls captured in CUDA graphs its device-time winner;
        ``TRACEA_ARBITER=0`` turns the check off."""
        from . import arbiter

        if not arbiter.enabled():
            return None
        v = arbiter.judge(decision, args[0].device, ours, theirs, args)
        eager = "tracea" if v.winner == "tracea" else "framework"
        captured = "tracea" if v.captured_winner == "tracea" else "framework"
        return eager, ("" if eager == captured == "tracea" else v.reason), captured

    def allows_fallback_only(self) -> bool:
        # PyTorch's own kernels beat the NumPy oracle by orders of magnitude (see tracea_torch.policy).
        from .policy import reference_allowed

        return reference_allowed()

    def owns(self, obj: Any) -> bool:
        # A tensor can only exist once torch is imported, so never import it here.
        torch = imported("torch")
        return torch is not None and isinstance(obj, torch.Tensor) and _causal_bias(obj) is None

    def structured_mask(self, obj: Any, like: Any) -> tuple[str, int, int, Any] | None:
        """torch's ``CausalBias`` (``torch.nn.attention.bias.causal_upper_left`` / ``causal_lower_right``):
        its alignment and lengths (its tensor data are a placeholder) and the boolean mask it stands for."""
        return causal_bias_mask(obj, like)

    def info(self, obj: Any) -> ArrayInfo:
        dtype = tracea_dtype(obj.dtype)
        return ArrayInfo(tuple(int(s) for s in obj.shape), tuple(int(s) for s in obj.stride()), dtype,
                         tracea_device(obj), self.name)

    def empty(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        import torch

        return torch.empty(tuple(int(s) for s in shape), dtype=torch_dtype(dtype), device=like.device)

    def contiguous(self, obj: Any) -> Any:
        return obj.contiguous()

    def empty_factory(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        """Cheapest first (a CUDA host, per call: ``empty_like`` 1.7 us, ``new_empty`` 2.7 us,
        ``torch.empty(shape, dtype=, device=)`` 3.2 us): ``torch.empty_like`` where the result has
        ``like``'s shape, dtype and packed row-major strides (a same-shape conv, a square linear); else
        ``new_empty`` (the device, and the dtype where it is ``like``'s, come from the call's tensor)."""
        import torch

        shape, tdt, dev, empty = tuple(int(s) for s in shape), torch_dtype(dtype), like.device, torch.empty
        if isinstance(like, torch.Tensor) and like.dtype is tdt:
            if tuple(like.shape) == shape and like.stride() == _empty_strides(shape):
                return torch.empty_like
            return lambda obj: obj.new_empty(shape)
        if dev.type == "cpu":
            return lambda obj: empty(shape, dtype=tdt)
        return lambda obj: empty(shape, dtype=tdt, device=dev)

    def swap_last(self, obj: Any) -> Any:
        return obj.transpose(-1, -2)

    def channels_last_factory(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        """``torch.empty(shape, memory_format=torch.channels_last)`` on ``like``'s device (4-D shapes)."""
        import torch

        if len(shape) != 4:
            return None
        shape, tdt, dev, empty, cl = (tuple(int(s) for s in shape), torch_dtype(dtype), like.device, torch.empty,
                                      torch.channels_last)
        if (isinstance(like, torch.Tensor) and like.dtype is tdt and tuple(like.shape) == shape
                and like.stride() == _empty_strides(shape, memory_format=cl)):
            return torch.empty_like  # (keeps the channels_last strides; see empty_factory)
        return lambda obj: empty(shape, dtype=tdt, device=dev, memory_format=cl)

    def reshape(self, obj: Any, shape: Sequence[int]) -> Any:
        return obj.view(tuple(int(s) for s in shape))

    def permute(self, obj: Any, axes: Sequence[int]) -> Any:
        return obj.permute(*axes)

    def astype(self, obj: Any, dtype: DType) -> Any:
        return obj.to(torch_dtype(dtype))

    def fp32_precision(self) -> Any:
        """torch's ``get_float32_matmul_precision()`` (``"highest"``, ``"high"`` = TF32, ``"medium"``)."""
        return _matmul_precision()

    def conv_fp32_precision(self, obj: Any) -> Any:
        """As ``F.conv2d`` computes float32: on CUDA, TF32 (``"high"``) while
        ``torch.backends.cudnn.allow_tf32`` is set (torch's default), else ``"highest"``; on the CPU,
        the matmul precision."""
        if obj.is_cuda:
            return "high" if _cudnn_tf32() else "highest"
        return _matmul_precision()

    def framework_state(self) -> Any:
        """(matmul precision, cuDNN TF32 flag): what the two precision rules read."""
        return _matmul_precision(), _cudnn_tf32()

    def to_numpy(self, obj: Any) -> np.ndarray:
        """A zero-copy NumPy view of a CPU tensor (writes through to the tensor)."""
        if obj.device.type != "cpu":
            raise UnsupportedDeviceError(f"a torch tensor on {obj.device} has no host view; use to_host()")
        t = obj.detach()
        if t.is_conj():
            t = t.resolve_conj()
        dtype = tracea_dtype(t.dtype)
        if dtype in _BIT_VIEWS:
            np_dtype = dtype.numpy
            if np_dtype is None:
                raise DTypeError("dtype", t.dtype, "a dtype NumPy can view; bfloat16/fp8 host views need "
                                 "ml_dtypes (pip install ml_dtypes) or a float32 copy")
            import torch

            return t.view(getattr(torch, _BIT_VIEWS[dtype])).numpy().view(np_dtype)
        return t.numpy()

    def host_bits(self, obj: Any) -> np.ndarray:
        """A zero-copy NumPy view of a CPU tensor's bits as unsigned integers of its item size (bf16 ->
        ``uint16``): needs no ml_dtypes, so CPU kernels can read bf16 tensors."""
        if obj.device.type != "cpu":
            raise UnsupportedDeviceError(f"a torch tensor on {obj.device} has no host view; use to_host()")
        found = _INT_VIEWS.get(obj.dtype)
        if found is None:
            import torch

            size = obj.element_size()
            ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            if size not in ints or obj.is_complex() or obj.dtype is torch.bool:
                raise DTypeError("dtype", obj.dtype, "a real dtype of 1, 2, 4 or 8 bytes")
            found = _INT_VIEWS[obj.dtype] = (ints[size], np.dtype(f"u{size}"))
        return obj.detach().view(found[0]).numpy().view(found[1])

    def from_numpy(self, arr: np.ndarray, device: Device) -> Any:
        import torch

        if device.kind not in self.device_kinds:
            raise UnsupportedDeviceError(f"the torch adapter allocates on cpu or cuda, not {device}")
        src = np.ascontiguousarray(arr)
        dtype = DType.parse(src.dtype, arg="arr")
        if dtype in _BIT_VIEWS:  # ml_dtypes array: reinterpret the bits
            t = torch.from_numpy(src.view(_BIT_VIEWS[dtype]).copy()).view(torch_dtype(dtype))
        else:
            t = torch.from_numpy(src.copy())
        return t.to(f"cuda:{device.index}") if device.kind == "cuda" else t

    def to_host(self, obj: Any) -> np.ndarray:
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # synchronizes with the producing stream
        return np.array(self.to_numpy(t), copy=True)

    def copy_(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def data_ptr(self, obj: Any) -> int:
        return obj.data_ptr()

    @property
    def raw_data_ptr(self) -> Any:
        """``torch.Tensor.data_ptr`` itself: what :meth:`data_ptr` returns, without this adapter's frame
        (launchers read four pointers per call)."""
        import torch

        return torch.Tensor.data_ptr

    def signature(self, obj: Any) -> Any:
        return obj.shape, obj.stride(), obj.dtype, obj.device

    def version(self, obj: Any) -> Any:
        """The tensor's version counter (bumped by every in-place torch op on it or on a view sharing its
        storage); None for inference tensors, which keep none. Writes torch does not see (through
        ``.data``, DLPack or a foreign kernel) do not bump it."""
        if obj.is_inference():
            return None
        return obj._version

    def capturing(self, obj: Any) -> bool:
        """Whether a CUDA graph is capturing on the current CUDA stream (of the current device: a capture
        records one device's stream)."""
        return obj.device.type == "cuda" and bool(stream_capturing()())

    def write_error(self, obj: Any) -> str | None:
        import torch

        if obj.requires_grad and torch.is_grad_enabled():
            return "it requires grad (out= tensors cannot take part in autograd, as in torch)"
        if obj.is_inference() and not torch.is_inference_mode_enabled():
            return "it is an inference tensor, which cannot be written outside torch.inference_mode()"
        return None

    def memory_span(self, obj: Any) -> tuple[int, int] | None:
        """Byte range of the tensor's elements (torch strides are never negative)."""
        if obj.numel() == 0:
            return None
        start = int(obj.data_ptr())
        last = sum((int(n) - 1) * int(st) for n, st in zip(obj.shape, obj.stride()))
        return start, start + (last + 1) * obj.element_size()

    def cuda_stream(self, obj: Any) -> int:
        """The raw ``cudaStream_t`` of torch's current stream on ``obj``'s device (0 for CPU)."""
        if obj.device.type != "cuda":
            return 0
        import torch

        return int(torch.cuda.current_stream(obj.device).cuda_stream)


def _cpu_conv_direct(op: Any, like: Any) -> bool:
    """Whether ``F.conv2d`` on the user's CPU tensors is what the fallback hook computes for this signature: float32
    NCHW with exact row-major strides (the hook computes 16-bit convs in float32 and re-packs channels_last or oddly
    strided inputs: PyTorch's CPU convolution returns wrong values for some of those, see
    :func:`tracea_torch.eager.conv2d`). 2-core Zen 4, depthwise 480@14^2 b1: the hook's path cost 151 vs 83 us."""
    from tracea.ir.ops import Layout

    from .eager import _row_major

    return str(like.dtype) == "torch.float32" and op.layout is Layout.NCHW and _row_major(like)


def _direct_matmul(op: Any, like: Any) -> Any:
    """``tracea.ops.matmul``'s call as PyTorch makes it on CUDA tensors (the user's logical operands: ``a``
    (..., m, k), ``b`` (..., k, n), a bias along n, at most one activation after it), or None where PyTorch
    would compute something else (fp32 at another precision than torch's own)."""
    if str(like.dtype) == "torch.float32" and op.fp32_precision.value != _matmul_precision():
        return None
    epilogue = _bias_activation(op)
    if epilogue is None:
        return None
    import torch

    biased, act = epilogue
    if biased and op.batch == 1 and like.dim() == 2:
        mm = lambda a, b, bias: torch.addmm(bias, a, b)  # noqa: E731 - cuBLAS's fused bias
    elif biased:
        mm = lambda a, b, bias: torch.matmul(a, b) + bias  # noqa: E731
    else:
        mm = lambda a, b, bias: torch.matmul(a, b)  # noqa: E731
    return mm if act is None else (lambda a, b, bias: act(mm(a, b, bias)))


def _bias_activation(op: Any) -> tuple[bool, Any] | None:
    """``(biased, activation)`` of an epilogue PyTorch's own call reproduces (an optional bias first, then at
    most one activation of :data:`tracea_torch.eager.ACTIVATIONS`, None for none); None for any other."""
    from tracea.ir.epilogue import EpilogueKind

    from .eager import ACTIVATIONS

    steps = op.epilogue.steps
    biased = steps[:1] == (EpilogueKind.BIAS,)
    rest = steps[1:] if biased else steps
    if len(rest) > 1 or (rest and rest[0] not in ACTIVATIONS):
        return None
    return biased, ACTIVATIONS[rest[0]] if rest else None
