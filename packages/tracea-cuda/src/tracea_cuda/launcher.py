"""Fast, capture-safe launches for the plan cache.

A launcher is bound once per call signature (``KernelVariant.bind``): it compiles what it needs *then*,
and on every call only reads the data pointers, writes them into a prepared parameter block and calls
``cuLaunchKernel`` on the caller's current stream (torch's for torch tensors, CuPy's otherwise).

CUDA-graph safety (``torch.cuda.graph`` / ``make_graphed_callables`` / CuPy graphs) comes from three rules:

* nothing is compiled or loaded while the launch stream is capturing: a first call of a signature
  inside a capture raises :class:`CaptureRefused` *before* touching the stream (tracea-torch then lets
  PyTorch compute that call; run the model once before capturing to get Tracea's kernels);
* scratch memory (transposes, 3xTF32 splits, split-K / stream-K partials) comes from the framework's
  stream-ordered allocator: outside capture most launchers keep one buffer per (device, stream)
  (:func:`split_scratch`, :func:`prepass_scratch`; launches on one stream run in order), inside capture
  every call takes its own (:func:`scratch`), so a graph allocates from its pool and never shares a
  buffer with eager calls;
* no synchronization and no host reads of device data on the launch path.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any, Callable, Sequence

import numpy as np

from tracea.errors import CaptureError, LaunchError
from tracea.runtime.arrays import imported

from . import toolkit


#: raised when a launch would need compilation (or another capture-unsafe step) while its stream is
#: capturing a CUDA graph; refused before anything touched the stream, so the capture stays valid.
CaptureRefused = CaptureError


def stream_getter(adapter: Any, dev: int) -> Callable[[], int]:
    """A function returning the raw ``cudaStream_t`` the caller's framework issues on, on device ``dev``:
    torch's current stream for torch tensors (an int, no Stream object: ~0.1 us), CuPy's otherwise."""
    if getattr(adapter, "name", "") == "torch":
        import torch  # noqa: PLC0415 - the caller already uses torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return functools.partial(raw, dev)  # (no Python frame per call)
        return lambda: int(torch.cuda.current_stream(dev).cuda_stream)
    cp = toolkit.cupy()
    return lambda: int(cp.cuda.get_current_stream().ptr)


def is_capturing(stream_ptr: int) -> bool:
    """Whether ``stream_ptr`` is capturing a CUDA graph (or its capture was invalidated)."""
    rt = toolkit.cupy().cuda.runtime
    query = getattr(rt, "streamIsCapturing", None)
    if query is not None:
        try:
            return int(query(stream_ptr)) != 0
        except Exception:  # noqa: BLE001 - an unknown stream handle: ask torch below
            pass
    torch = imported("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def capturing_now() -> bool:
    """Whether the current stream of torch or CuPy is capturing (for code that does not know its stream)."""
    torch = imported("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    cp = toolkit.cupy()
    return is_capturing(int(cp.cuda.get_current_stream().ptr))


def refuse_if_capturing(stream_ptr: int, what: str) -> None:
    """Raise :class:`CaptureRefused` when ``stream_ptr`` is capturing (call before compiling)."""
    if is_capturing(stream_ptr):
        raise CaptureRefused(f"{what}: the first call of this signature happens inside CUDA graph capture, where "
                             f"kernels cannot be compiled or loaded; run it once before capturing", backend="cuda")


def scratch(adapter: Any, like: Any, n: int, zeroed: bool = False) -> Any:
    """A float32 buffer of ``n`` elements from the framework's stream-ordered allocator on ``like``'s
    device: torch's caching allocator for torch tensors (graph-aware during capture), CuPy's pool
    otherwise. Allocated per call and released after the launch: stream order makes reuse safe."""
    if getattr(adapter, "name", "") == "torch":
        import torch  # noqa: PLC0415

        make = torch.zeros if zeroed else torch.empty
        return make(max(n, 1), dtype=torch.float32, device=like.device)
    cp = toolkit.cupy()
    make = cp.zeros if zeroed else cp.empty
    return make(max(n, 1), dtype=np.float32)


#: (device, stream) -> (counters address, workspace address, their sizes in 4-byte elements, the buffers,
#: the entry it replaced)
_split_buffers: dict[tuple[int, int], tuple[int, int, int, int, Any, Any, Any]] = {}
_split_lock = threading.Lock()


def split_scratch(adapter: Any, like: Any, dev: int, stream_ptr: int, flag_words: int, ws_floats: int) -> tuple[int, int]:
    """Addresses of split-K counters (``flag_words`` 32-bit words, zero) and fp32 partial-sum workspace
    (``ws_floats``) for a launch on ``stream_ptr``: one pair per (device, stream), shared by every split-K
    launcher and kept across calls, so a call allocates and clears nothing. Sharing is safe because launches
    on one stream run one after another, every split-K kernel leaves the counters it used at zero (the last
    piece of a tile re-zeroes them) and writes each partial sum before it is read. Grown (never shrunk) on
    demand: the new counters are zeroed on the stream; the old buffers stay allocated (the new entry holds
    the old one), since another thread may have taken their addresses for a launch not yet queued. Not for
    CUDA graph capture (a captured graph could replay on another stream): capture takes :func:`scratch` per
    call."""
    key = (dev, stream_ptr)
    entry = _split_buffers.get(key)
    if entry is None or entry[2] < flag_words or entry[3] < ws_floats:
        with _split_lock:
            old = _split_buffers.get(key)
            flags_n = max(flag_words, old[2] if old else 0, 1)
            ws_n = max(ws_floats, old[3] if old else 0, 1)
            flags, ws = scratch(adapter, like, flags_n, zeroed=True), scratch(adapter, like, ws_n)
            entry = _split_buffers[key] = (adapter.data_ptr(flags), adapter.data_ptr(ws), flags_n, ws_n, flags, ws,
                                           old)
    return entry[0], entry[1]


def reducing_split_buffers(adapter: Any, out: Any, dev: int, stream_ptr: int, sizes: tuple[int, int, int, int],
                           ptr: Callable[[Any], int]) -> tuple[int, int, Any]:
    """(partials address, counters address, a buffer to keep alive until the launch is queued) for a one-launch
    split-K kernel whose last piece of a tile reduces and re-zeroes its counter. ``sizes`` = (counter words, partial
    floats, floats of a buffer of the call's own, byte offset of its partials): outside capture the stream's split
    scratch (:func:`split_scratch`), inside CUDA graph capture a zeroed buffer of the call's own (a captured graph
    may replay on another stream), counters first."""
    flag_words, ws_floats, own_floats, ws_offset = sizes
    if is_capturing(stream_ptr):
        keep = scratch(adapter, out, own_floats, zeroed=True)
        flags = ptr(keep)
        return flags + ws_offset, flags, keep
    flags, ws = split_scratch(adapter, out, dev, stream_ptr, flag_words, ws_floats)
    return ws, flags, None


def split_k_launcher(adapter: Any, dev: int, name: str, split: bool,
                     build: Callable[[int], tuple["FastLaunch", tuple[int, int, int, int]]],
                     align_class: Callable[[int, int], int]) -> Callable[..., None]:
    """A pointer-only ``launch(a, b, bias, out)`` of a one-launch kernel with arguments ``(a, b, out, bias, ws,
    flags)`` that, when ``split``, sums its K slices itself through :func:`reducing_split_buffers` (``rows_kn``,
    ``rows_fma``). ``build(cls)`` gives the kernel's launch and its buffer sizes for the operands' alignment class
    ``align_class(pa, pb)`` (class 0 is built now; another is compiled on its first call, never inside capture)."""
    stream, ptr, device = stream_getter(adapter, dev), pointer_getter(adapter), on_device(dev)
    refuse_if_capturing(stream(), name)
    current, single = toolkit.cupy().cuda.runtime.getDevice, single_device()
    entries = {0: build(0)}
    buffers = reducing_split_buffers

    def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
        pa, pb, po = ptr(a), ptr(b), ptr(out)
        pbias = po if bias is None else ptr(bias)
        s = stream()
        cls = align_class(pa, pb)
        entry = entries.get(cls)
        if entry is None:  # operands of another alignment: another compiled kernel (not while capturing)
            refuse_if_capturing(s, name)
            entry = entries[cls] = build(cls)
        fl, sizes = entry
        pw, pf, keep = buffers(adapter, out, dev, s, sizes, ptr) if split else (po, po, None)
        if single or current() == dev:
            fl(s, (pa, pb, po, pbias, pw, pf))
        else:
            with device():
                fl(s, (pa, pb, po, pbias, pw, pf))
        del keep  # (alive until the launch is queued)

    launch.pointer_only = True  # type: ignore[attr-defined]
    return launch


def pointer_getter(adapter: Any) -> Callable[[Any], int]:
    """The function a launcher reads its arrays' addresses with: the array type's own (C) method where the
    adapter names one (``raw_data_ptr``: no adapter frame per pointer), else ``adapter.data_ptr``."""
    return getattr(adapter, "raw_data_ptr", None) or adapter.data_ptr


@functools.lru_cache(maxsize=1)
def single_device() -> bool:
    """Whether the process sees one CUDA device (then it is always the current one: launchers skip the
    ``cudaGetDevice`` check)."""
    try:
        return int(toolkit.cupy().cuda.runtime.getDeviceCount()) == 1
    except Exception:  # noqa: BLE001 - unknown: check on every launch
        return False


def to_ctypes(value: Any) -> Any:
    """A kernel argument as a ctypes value (NumPy scalars from ``kernel_args``, ints, ctypes values)."""
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure)):
        return value
    if isinstance(value, np.uint64):
        return ctypes.c_uint64(int(value))
    if isinstance(value, np.int64):
        return ctypes.c_int64(int(value))
    if isinstance(value, np.int32):
        return ctypes.c_int32(int(value))
    if isinstance(value, np.float32):
        return ctypes.c_float(float(value))
    raise LaunchError(f"cannot pass {type(value).__name__} to a kernel", backend="cuda")


class ParamBlock:
    """A kernel's parameters as ctypes values, the ``void*[]`` pointing at them, and which of them hold
    which data pointer (found by building the arguments once with distinct sentinel addresses)."""

    def __init__(self, values: Sequence[Any], slots: Sequence[tuple[Any, int]]) -> None:
        self.holders = [to_ctypes(v) for v in values]
        self.params = (ctypes.c_void_p * len(self.holders))(
            *[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in self.holders])
        self.address = ctypes.addressof(self.params)
        self.slots = [(self.holders[i], role) for i, role in slots]

    @classmethod
    def from_args(cls, make_args: Callable[[dict[str, int]], Sequence[Any]], roles: Sequence[str]) -> "ParamBlock":
        """Build from ``make_args(ptrs)`` (a variant's ``kernel_args``), locating each role's pointer."""
        sentinels = {role: (0x7E57_0000_0000 + (i + 1) * 0x1000_0000) for i, role in enumerate(roles)}
        values = list(make_args(dict(sentinels)))
        back = {v: i for i, v in enumerate(sentinels.values())}
        slots = []
        for j, v in enumerate(values):
            if isinstance(v, (np.uint64, int)) and int(v) in back:
                slots.append((j, back[int(v)]))
        if sorted({r for _, r in slots}) != list(range(len(roles))):
            missing = [roles[i] for i in range(len(roles)) if i not in {r for _, r in slots}]
            if any(r != "bias" for r in missing):
                raise LaunchError(f"kernel arguments do not carry pointers {missing}", backend="cuda")
        return cls(values, slots)


class FastLaunch:
    """One kernel with a fixed grid and parameter block; ``launch(stream, ptrs)`` sets the pointers
    (by role index) and calls ``cuLaunchKernel``. A lock keeps threads from interleaving the two."""

    def __init__(self, function: Any, grid: tuple[int, int, int], block: int, smem: int, params: ParamBlock) -> None:
        self.function = function  # (it keeps its module loaded: the handle below stays valid)
        self.fptr = int(function.ptr)
        self.grid, self.block, self.smem, self.params = grid, block, smem, params
        self._lock = threading.Lock()
        self._launch = toolkit.cupy().cuda.driver.launchKernel

    def __call__(self, stream: int, ptrs: Sequence[int]) -> None:
        gx, gy, gz = self.grid
        with self._lock:
            for holder, role in self.params.slots:
                holder.value = ptrs[role]
            try:
                self._launch(self.fptr, gx, gy, gz, self.block, 1, 1, self.smem, stream, self.params.address, 0)
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"cuLaunchKernel failed: {type(exc).__name__}: {exc}", backend="cuda") from None


def pair_launch(function: Any, job0: tuple[tuple[int, int, int], Sequence[int]],
                job1: tuple[tuple[int, int, int], Sequence[int]]) -> FastLaunch:
    """One 256-thread launch doing two jobs of a helper kernel's ``_pair`` entry point, which takes
    ``(src0, dst0, *ints0, gx0, gy0, src1, dst1, *ints1, gx1, gy1, blocks0)`` and runs a 1-D grid of job 0's
    ``gx0*gy0*gz0`` tiles then job 1's (``job = (grid, ints)``). Pointers by role: src0, dst0, src1, dst1."""
    (g0, ints0), (g1, ints1) = job0, job1
    blocks0, blocks1 = g0[0] * g0[1] * g0[2], g1[0] * g1[1] * g1[2]

    def args(p: dict[str, int]) -> tuple:
        return (np.uint64(p["src0"]), np.uint64(p["dst0"]), *map(np.int32, (*ints0, g0[0], g0[1])),
                np.uint64(p["src1"]), np.uint64(p["dst1"]), *map(np.int32, (*ints1, g1[0], g1[1], blocks0)))

    return FastLaunch(function, (blocks0 + blocks1, 1, 1), 256, 0,
                      ParamBlock.from_args(args, ("src0", "dst0", "src1", "dst1")))


#: byte alignment of the second scratch region of :func:`with_prepasses` (TMA wants 16; 256 keeps
#: every access of the kernels reading it as aligned as a fresh allocation)
SCRATCH_ALIGN = 256


#: pre-pass scratch up to this many bytes -- or 1/128 of the device's memory where that is more (640 MB
#: on an 80 GB H100) -- is kept per (device, stream) across calls (:func:`prepass_scratch`); larger
#: buffers are taken from the allocator per call, where the pre-pass alone (reading and writing that many
#: bytes) takes long enough on the GPU to hide the allocation
PREPASS_KEEP_BYTES = 256 << 20


def prepass_keep_bytes(dev: int) -> int:
    """The largest pre-pass scratch kept for device ``dev`` (see :data:`PREPASS_KEEP_BYTES`)."""
    try:
        total = int(toolkit.cupy().cuda.runtime.getDeviceProperties(dev)["totalGlobalMem"])
    except Exception:  # noqa: BLE001 - no device facts: the floor
        total = 0
    return max(PREPASS_KEEP_BYTES, total // 128)

#: (device, stream) -> (address, size in bytes, the buffer): each stream's pre-pass scratch
_prepass_buffers: dict[tuple[int, int], tuple[int, int, Any]] = {}
#: held from a pre-pass launch to its kernel's launch when they use a stream's kept scratch: another
#: thread issuing on the same stream must not rewrite the scratch between the two
_prepass_lock = threading.Lock()


def prepass_scratch(adapter: Any, like: Any, dev: int, stream_ptr: int, nbytes: int) -> int:
    """The address of ``nbytes`` of scratch for a pre-pass and the kernel reading it on ``stream_ptr``:
    one grow-only buffer per (device, stream), kept across calls (no allocation per call). Reuse is safe
    because launches on one stream run in order and :func:`with_prepasses` holds ``_prepass_lock`` from
    the pre-pass to its kernel. A buffer outgrown is released to the framework's stream-ordered
    allocator (it was allocated on this stream, so nothing reuses it before the kernels queued here
    finish). Not for CUDA graph capture (a graph may replay on another stream: capture allocates per call);
    :func:`release_scratch` gives the buffers back."""
    key = (dev, stream_ptr)
    entry = _prepass_buffers.get(key)
    if entry is None or entry[1] < nbytes:
        buf = scratch(adapter, like, -(-nbytes // 4))
        entry = _prepass_buffers[key] = (adapter.data_ptr(buf), nbytes, buf)
    return entry[0]


def release_scratch() -> None:
    """Give the kept per-stream scratch (pre-pass buffers and split-K partial sums) back to the
    framework's allocator, e.g. before ``torch.cuda.empty_cache()``; the next launch that needs scratch
    allocates it again. Call it with no Tracea launch in flight on another thread."""
    with _prepass_lock, _split_lock:
        _prepass_buffers.clear()
        _split_buffers.clear()


def with_prepasses(adapter: Any, dev: int, stream: Callable[[], int], sizes: tuple[int, int], dtype: Any,
                   prepass: FastLaunch, inner: Callable[..., None]) -> Callable[..., None]:
    """A pointer-only launcher ``launch(x0, x1, bias, out)`` that first rewrites both operands into one
    scratch buffer -- ``prepass`` (a :func:`pair_launch`) reads x0 and x1 and writes ``sizes[0]`` then
    ``sizes[1]`` elements of ``dtype`` into its two regions -- then runs the pointer form of ``inner``
    (``inner.by_pointer(p0, p1, bias, out)``) on the two regions, all on ``stream()``: two launches per
    call. ``sizes[1] == 0``: only x0 is rewritten (``prepass`` reads x0 and writes region 0) and ``inner``
    reads x1 in place (it must be 16-byte aligned). The scratch is the stream's kept buffer
    (:func:`prepass_scratch`) up to
    :func:`prepass_keep_bytes`; larger ones, and every call inside CUDA graph capture, take a buffer from
    the caller's allocator per call (released after the launches; stream order makes reuse safe)."""
    ptr, device = pointer_getter(adapter), on_device(dev)
    itemsize = dtype.itemsize
    align = max(1, SCRATCH_ALIGN // itemsize)
    offset = -(-sizes[0] // align) * align
    byte_offset = offset * itemsize
    nbytes = (offset + sizes[1]) * itemsize
    keep = nbytes <= prepass_keep_bytes(dev)
    factory: list[Any] = []
    by_pointer = inner.by_pointer  # type: ignore[attr-defined]
    capturing, lock = is_capturing, _prepass_lock
    second = sizes[1] > 0

    def launch(x0: Any, x1: Any, bias: Any, out: Any) -> None:
        s = stream()
        p1 = ptr(x1)
        if keep and not capturing(s):
            with lock:
                with device():
                    t0 = prepass_scratch(adapter, x0, dev, s, nbytes)
                    prepass(s, (ptr(x0), t0, p1, t0 + byte_offset))
                by_pointer(t0, t0 + byte_offset if second else p1, bias, out)
            return
        if not factory:
            factory.append(adapter.empty_factory((offset + sizes[1],), dtype, x0))
        buf = factory[0](x0)
        t0 = ptr(buf)
        t1 = t0 + byte_offset
        with device():
            prepass(s, (ptr(x0), t0, p1, t1))
        by_pointer(t0, t1 if second else p1, bias, out)
        del buf  # after both launches are queued

    launch.pointer_only = True  # type: ignore[attr-defined]
    return launch


#: the context when ``dev`` is already current: nothing to do (reusable)
_SAME = contextlib.nullcontext()


def on_device(dev: int) -> Callable[[], Any]:
    """A context-manager factory making ``dev`` current only when it is not already: one ``cudaGetDevice``
    a call, none in a process that sees one device (:func:`single_device`)."""
    if single_device():
        return lambda: _SAME
    cp = toolkit.cupy()
    get = cp.cuda.runtime.getDevice
    return lambda: _SAME if get() == dev else cp.cuda.Device(dev)


def align_key(ptrs: Sequence[int]) -> tuple[int, ...]:
    """The alignment class of a call's pointers (what the compiled variant depends on)."""
    return tuple(p & 15 for p in ptrs)


__all__ = ["CaptureRefused", "FastLaunch", "ParamBlock", "align_key", "capturing_now", "is_capturing", "on_device",
           "pair_launch", "prepass_scratch", "refuse_if_capturing", "release_scratch", "scratch", "split_scratch",
           "stream_getter", "with_prepasses"]
