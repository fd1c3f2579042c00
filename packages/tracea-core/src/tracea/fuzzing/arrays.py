"""Fuzz arrays: one model for every memory layout a case asks for, and its materialisation as a
NumPy array, a torch tensor (CPU or CUDA), a CuPy array, a Python list or a scalar.

Every array is a view ``(byte offset, shape, byte strides)`` into a flat byte buffer (its *root*).
Contiguous, transposed, sliced, reversed, overlapping (``as_strided``), expanded (stride 0),
channels_last, unaligned and record-field views are all just geometries, so the harness knows
exactly which bytes an array covers: inputs must come back byte-identical, and an ``out=`` view must
not have bytes outside its elements written. Bytes no view covers hold ``0xFF`` (a NaN pattern for
every float dtype), so a kernel reading past a view produces NaN rather than plausible numbers.

Torch and CuPy are imported only when a case asks for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: dtypes a case may ask for; ``bfloat16`` is stored as uint16 bits on the host (NumPy has none).
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int8": 1, "bool": 1,
            "complex64": 8}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
#: views only NumPy (and CuPy, for ``reversed``) can express; other kinds get a contiguous array.
NUMPY_ONLY_VIEWS = {"reversed": ("numpy", "cupy"), "unaligned": ("numpy",), "record": ("numpy",)}
FILL = 0xFF


@dataclass
class ArraySpec:
    """How to build one array argument.

    :param shape: logical shape (what the op sees).
    :param dtype: one of :data:`ITEMSIZE`.
    :param kind: ``numpy`` | ``torch`` | ``list`` | ``scalar`` (on ``--device cuda``, ``numpy`` becomes
        a CuPy array when CuPy is importable, else a CUDA tensor).
    :param view: ``contig`` | ``fortran`` | ``transposed`` | ``permuted`` | ``sliced`` | ``reversed`` |
        ``overlap`` | ``expanded`` | ``channels_last`` | ``unaligned`` | ``record``.
    :param param: view parameters chosen by the generator (axis, step, permutation ...).
    :param special: inject ``nan`` | ``inf`` | ``ninf`` | ``mix`` values at ``nspecial`` positions.
    :param share: name of an earlier array whose buffer this one lives in (aliasing ``out=``), at
        element ``share_offset`` of that buffer.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    kind: str = "numpy"
    view: str = "contig"
    param: dict[str, Any] = field(default_factory=dict)
    readonly: bool = False
    requires_grad: bool = False
    special: str | None = None
    nspecial: int = 1
    scale: float = 1.0
    share: str | None = None
    share_offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v not in (None, False, {}, 0) or k in ("shape", "dtype")}
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ArraySpec":
        d = dict(d)
        d["shape"] = tuple(d["shape"])
        return cls(**d)

    def describe(self) -> str:
        """Short text: ``numpy float32 (7, 13) transposed, 2 nan``."""
        bits = [self.kind, self.dtype, str(tuple(self.shape))]
        if self.view != "contig":
            bits.append(self.view + (f"{self.param}" if self.param else ""))
        if self.readonly:
            bits.append("read-only")
        if self.requires_grad:
            bits.append("requires_grad")
        if self.special:
            bits.append(f"{self.nspecial} {self.special}")
        if self.share:
            bits.append(f"in {self.share}'s buffer at element {self.share_offset}")
        return " ".join(bits)


@dataclass
class Geometry:
    """Byte offset and strides of a view, and the buffer size it needs."""

    offset: int
    strides: tuple[int, ...]
    nbytes: int


def effective_view(spec: ArraySpec, kind: str) -> str:
    """The view a spec gets for array ``kind`` (views a kind cannot express become ``contig``)."""
    allowed = NUMPY_ONLY_VIEWS.get(spec.view)
    if allowed is not None and kind not in allowed:
        return "contig"
    return spec.view


def _c_strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


def geometry(spec: ArraySpec, view: str) -> Geometry:
    """Element layout of ``spec`` in ``view``, in bytes (see :class:`ArraySpec` for the views)."""
    shape, item, nd, p = tuple(spec.shape), ITEMSIZE[spec.dtype], len(spec.shape), spec.param
    if math.prod(shape) == 0:  # empty: any strides; keep the offset inside the buffer
        return Geometry(0, tuple(s * item for s in _c_strides(shape)), item)
    if view == "record":  # a field of a structured array: rows of (value, 1 pad byte)
        rec = item + 1
        strides = [s * rec for s in _c_strides(shape)]
        return Geometry(0, tuple(strides), max(1, math.prod(shape)) * rec + item)
    order = list(range(nd))
    if view == "fortran":
        order = order[::-1]
    elif view == "transposed" and nd >= 2:
        order[-1], order[-2] = order[-2], order[-1]
    elif view == "permuted":
        order = list(p.get("perm", order))
    elif view == "channels_last" and nd == 4:
        order = [0, 2, 3, 1]
    stored = tuple(shape[i] for i in order)
    st_stored = _c_strides(stored)
    strides = [0] * nd
    for pos, axis in enumerate(order):
        strides[axis] = st_stored[pos]
    extent = max(1, math.prod(stored))
    offset = 0
    if view == "sliced":  # every step-th element along some axes, after a leading offset
        steps = p.get("steps", [2] * nd)
        big = tuple(s * st for s, st in zip(shape, steps))
        st_big = _c_strides(big)
        strides = [a * b for a, b in zip(st_big, steps)]
        offset = int(p.get("offset", 1))
        extent = offset + max(1, math.prod(big))
    elif view == "reversed":  # negative stride along one axis
        axis = int(p.get("axis", 0)) % max(nd, 1)
        if nd:
            offset = (shape[axis] - 1) * strides[axis] if shape[axis] > 0 else 0
            strides[axis] = -strides[axis]
    elif view == "overlap":  # sliding windows: a stride smaller than the extent of the inner dims
        axis = int(p.get("axis", 0)) % max(nd, 1)
        if nd:
            strides[axis] = int(p.get("stride", 1))
            extent = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides) if s > 0)
    elif view == "expanded":  # stride 0 along one axis (a broadcast)
        axis = int(p.get("axis", 0)) % max(nd, 1)
        if nd:
            strides[axis] = 0
            extent = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides) if s > 0)
    shift = int(p.get("byte_shift", 1)) if view == "unaligned" else 0
    return Geometry(offset * item + shift, tuple(s * item for s in strides), extent * item + shift)


def covered_bytes(geo: Geometry, shape: tuple[int, ...], item: int, nbytes: int) -> np.ndarray:
    """Boolean mask over a buffer of ``nbytes``: the bytes a view's elements occupy."""
    mask = np.zeros(nbytes, dtype=bool)
    if math.prod(shape) == 0:
        return mask
    addr = np.full((1,) * len(shape), geo.offset, dtype=np.int64)
    for axis, (size, st) in enumerate(zip(shape, geo.strides)):
        idx = np.arange(size, dtype=np.int64).reshape([-1 if i == axis else 1 for i in range(len(shape))])
        addr = addr + idx * st
    addr = addr.reshape(-1)
    for j in range(item):
        mask[addr + j] = True
    return mask


# ------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------

def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even), as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def host_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype holding ``dtype`` on the host (bfloat16: its uint16 bits)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype("bool" if dtype == "bool" else dtype)


def random_values(spec: ArraySpec, rng: np.random.Generator) -> np.ndarray:
    """Logical values for ``spec`` (host dtype), with special values injected."""
    shape = tuple(spec.shape)
    if spec.dtype == "bool":
        return rng.random(shape) < 0.5
    if spec.dtype in ("int32", "int8"):
        return rng.integers(-3, 4, size=shape).astype(spec.dtype)
    vals = rng.standard_normal(shape) * spec.scale
    if spec.dtype == "complex64":
        return (vals + 1j * rng.standard_normal(shape)).astype(np.complex64)
    if spec.special and vals.size:
        flat = vals.reshape(-1)
        choices = {"nan": [np.nan], "inf": [np.inf], "ninf": [-np.inf], "mix": [np.nan, np.inf, -np.inf]}
        for pos in rng.choice(flat.size, size=min(spec.nspecial, flat.size), replace=False):
            flat[pos] = rng.choice(choices[spec.special])
    if spec.dtype == "bfloat16":
        return f32_to_bf16_bits(vals.astype(np.float32))
    return vals.astype(spec.dtype)


def logical_f64(values: np.ndarray, dtype: str) -> np.ndarray:
    """Host values (bf16 as bits) as float64 (complex stays complex128)."""
    if dtype == "bfloat16":
        return bf16_bits_to_f64(values)
    if dtype == "complex64":
        return np.asarray(values, dtype=np.complex128)
    return np.asarray(values, dtype=np.float64)


# ------------------------------------------------------------------------------------------------
# Materialisation
# ------------------------------------------------------------------------------------------------

@dataclass
class Built:
    """One materialised argument: the object passed to the op and what the oracle needs of it."""

    name: str
    spec: ArraySpec
    obj: Any
    kind: str               # numpy | torch | cupy | list | scalar
    values: np.ndarray | None = None   # logical float64 values before the call (None: no array)
    root: str | None = None            # name of the buffer it lives in
    geo: Geometry | None = None
    view: str = "contig"


@dataclass
class Buffers:
    """The flat byte buffers of one case, by name, in the array kind they were made for."""

    host: dict[str, np.ndarray] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def snapshot(self) -> dict[str, np.ndarray]:
        """A host copy of every buffer's bytes (synchronising device memory)."""
        return {name: to_host_bytes(self.device[name], self.kinds[name]) for name in self.device}


def to_host_bytes(buf: Any, kind: str) -> np.ndarray:
    if kind == "numpy":
        return np.array(buf, copy=True)
    if kind == "torch":
        return buf.detach().cpu().numpy().copy()
    if kind == "cupy":
        import cupy

        return cupy.asnumpy(buf)
    raise ValueError(kind)


def resolve_kind(kind: str, device: str) -> str:
    """The array kind a spec's ``kind`` becomes on ``device`` (``cuda``: NumPy -> CuPy or torch)."""
    if device == "cpu" or kind in ("list", "scalar", "torch"):
        return kind
    try:
        import cupy  # noqa: F401

        return "cupy"
    except ImportError:
        return "torch"


def build_arrays(specs: dict[str, ArraySpec], rng: np.random.Generator, device: str) -> tuple[dict[str, Built], Buffers]:
    """Materialise ``specs`` (in order; shared buffers first come first) on ``device``."""
    built: dict[str, Built] = {}
    bufs = Buffers()
    plans: dict[str, tuple[Geometry, str, str]] = {}
    sizes: dict[str, int] = {}
    for name, spec in specs.items():
        kind = resolve_kind(spec.kind, device)
        if kind in ("list", "scalar"):
            continue
        view = effective_view(spec, kind)
        geo = geometry(spec, view)
        # a buffer holds arrays of one kind (a case may have turned the sharer into another kind)
        share_ok = spec.share in plans and resolve_kind(specs[spec.share].kind, device) == kind
        root = spec.share if share_ok else name
        if root != name:
            geo = Geometry(geo.offset + spec.share_offset * ITEMSIZE[spec.dtype], geo.strides,
                           geo.nbytes + spec.share_offset * ITEMSIZE[spec.dtype])
        plans[name] = (geo, root, view)  # type: ignore[assignment]
        sizes[root] = max(sizes.get(root, 0), geo.nbytes, 16)  # type: ignore[arg-type,index]
    for root, size in sizes.items():
        item = max(ITEMSIZE[specs[n].dtype] for n, (_, r, _) in plans.items() if r == root)
        bufs.host[root] = np.full(-(-size // item) * item, FILL, dtype=np.uint8)
    for name, spec in specs.items():
        kind = resolve_kind(spec.kind, device)
        values = random_values(spec, rng)
        if kind in ("list", "scalar"):
            f64 = logical_f64(values, spec.dtype)
            obj = f64.tolist() if kind == "list" else (float(f64.reshape(-1)[0]) if f64.size else 0.0)
            built[name] = Built(name, spec, obj, kind, np.asarray(f64) if kind == "list" else np.asarray(obj))
            continue
        geo, root, view = plans[name]
        host = np.ndarray(tuple(spec.shape), dtype=host_dtype(spec.dtype), buffer=bufs.host[root],
                          offset=geo.offset, strides=geo.strides)
        host[...] = values
        built[name] = Built(name, spec, None, kind, logical_f64(np.array(host), spec.dtype), root, geo, view)
    for root, data in bufs.host.items():
        kind = next(b.kind for b in built.values() if b.root == root)
        bufs.kinds[root] = kind
        bufs.device[root] = _device_buffer(data, kind, device)
    for b in built.values():
        if b.root is not None:
            b.obj = _typed_view(bufs.device[b.root], b, device)
    return built, bufs


def _device_buffer(data: np.ndarray, kind: str, device: str) -> Any:
    if kind == "numpy":
        return data
    if kind == "torch":
        import torch

        t = torch.from_numpy(data.copy())
        return t.to(device) if device != "cpu" else t
    import cupy

    return cupy.asarray(data)


def _typed_view(buf: Any, b: Built, device: str) -> Any:
    spec, geo = b.spec, b.geo
    assert geo is not None
    if b.kind == "numpy":
        if spec.dtype == "bfloat16":
            import ml_dtypes  # generator only asks for NumPy bf16 when it is importable

            dt: Any = np.dtype(ml_dtypes.bfloat16)
        else:
            dt = host_dtype(spec.dtype)
        arr = np.ndarray(tuple(spec.shape), dtype=dt, buffer=buf, offset=geo.offset, strides=geo.strides)
        if spec.readonly:
            arr.flags.writeable = False
        return arr
    if b.kind == "torch":
        import torch

        tdt = getattr(torch, spec.dtype)
        item = ITEMSIZE[spec.dtype]
        typed = buf[: buf.numel() // item * item].view(tdt)
        t = torch.as_strided(typed, tuple(spec.shape), tuple(s // item for s in geo.strides), geo.offset // item)
        if spec.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t
    import cupy

    return cupy.ndarray(tuple(spec.shape), dtype=host_dtype(spec.dtype), memptr=buf.data + geo.offset,
                        strides=geo.strides)


def result_f64(obj: Any) -> np.ndarray:
    """A host float64 copy of a result of any array kind (complex stays complex)."""
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch":
        t = obj.detach().cpu()
        if t.dtype.is_complex:
            return t.numpy().astype(np.complex128)
        return t.to(__import__("torch").float64).numpy()
    if mod == "cupy":
        import cupy

        obj = cupy.asnumpy(obj)
    arr = np.asarray(obj)
    return arr.astype(np.complex128 if np.iscomplexobj(arr) else np.float64)


def array_kind(obj: Any) -> str:
    """``numpy`` | ``torch`` | ``cupy`` | the type's module name."""
    if isinstance(obj, np.ndarray):
        return "numpy"
    return type(obj).__module__.split(".")[0]


def dtype_name(obj: Any) -> str:
    """The dtype of an array of any kind, as a plain name (``float32``, ``bfloat16``)."""
    return str(getattr(obj, "dtype", "")).replace("torch.", "")


def device_of(obj: Any) -> str:
    """``cpu`` or ``cuda:N`` for an array of any kind."""
    dev = getattr(obj, "device", None)
    if dev is None or isinstance(obj, np.ndarray):
        return "cpu"
    text = str(dev)
    if text.startswith("<CUDA Device"):  # CuPy
        return f"cuda:{int(dev.id)}"
    return "cpu" if text == "cpu" else text
