"""Operator descriptions (Core IR, L2): what to compute, independent of how.

Each op is an immutable, validated dataclass that knows its FLOP count, the minimum bytes it must move
(every input read once, the output written once) and a stable ``key`` used by the tuning cache.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from ..dtypes import DType, Fp32Precision
from ..errors import InvalidArgumentError, LayoutError
from .epilogue import Epilogue, EpilogueKind
from .hashing import memo_hash
from .shape import Shape, check_non_negative, check_positive


class LayerType(enum.Enum):
    """The operator families (seed: ``LayerType::Gemm`` ...)."""

    GEMM = "gemm"
    CONV2D = "conv2d"
    ATTENTION = "attention"

    # Seed spelling aliases.
    Gemm = "gemm"
    Conv2d = "conv2d"
    Attention = "attention"


class Layout(enum.Enum):
    """Activation memory layout for conv2d. NCHW pairs with KCRS weights, NHWC with KRSC weights."""

    NCHW = "nchw"
    NHWC = "nhwc"

    @classmethod
    def parse(cls, value: Any, arg: str = "layout") -> "Layout":
        if isinstance(value, Layout):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("channels_last", "nhwc").replace("contiguous", "nchw")
            for member in cls:
                if member.value == key:
                    return member
        raise LayoutError(arg, value, "'NCHW' or 'NHWC' (channels_last)")


class Op:
    """Common protocol of :class:`GemmOp`, :class:`Conv2dOp` and :class:`AttentionOp`."""

    kind: ClassVar[LayerType]
    #: input array roles in the order launchers take them (see ``KernelVariant.bind``)
    roles: ClassVar[tuple[str, ...]] = ()

    @property
    def flops(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def min_bytes(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @functools.cached_property
    def key(self) -> str:
        """Stable text key: the op kind then every field as ``name=value`` in declaration order
        (computed once per op object: the tuning cache looks it up on every dispatch)."""
        parts = [self.kind.value]
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get("key_if_set") and value == f.default:
                continue  # a field added later: keys of ops without it stay as they were (tuning cache)
            parts.append(f"{f.name}={_key_value(value)}")
        return ":".join(parts)

    @property
    def dtypes(self) -> tuple[DType, ...]:
        """Input storage dtypes (used by requirement matching)."""
        raise NotImplementedError  # pragma: no cover

    @property
    def out_dtype(self) -> DType:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :func:`op_from_dict` inverts it."""
        out: dict[str, Any] = {"kind": self.kind.value}
        for f in fields(self):  # type: ignore[arg-type]
            out[f.name] = _key_value(getattr(self, f.name), json=True)
        return out

    def describe(self) -> str:
        """Short human text, e.g. ``gemm 1024x1024x1024 f32 +bias+relu``."""
        raise NotImplementedError  # pragma: no cover


def _key_value(v: Any, json: bool = False) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Epilogue):
        return v.key
    if isinstance(v, tuple):
        return list(v) if json else "x".join(str(x) for x in v)
    if isinstance(v, bool):
        return v if json else int(v)
    if isinstance(v, float):
        return v if json else repr(v)
    return v


def _pair(arg: str, value: Any, positive: bool) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise InvalidArgumentError(arg, value, "an int or a pair of ints")
        a, b = value
    else:
        a = b = value
    check = check_positive if positive else check_non_negative
    return check(arg, a), check(arg, b)


@memo_hash
@dataclass(frozen=True)
class GemmOp(Op):
    """``out[b] = epilogue(op(A[b]) @ op(B[b]))`` with ``op(A)`` of shape (m, k) and ``op(B)`` (k, n).

    ``trans_a`` means A is stored as (k, m) row-major (a column-major m x k matrix); likewise
    ``trans_b`` means B is stored (n, k). A bias is a length-n vector added along the columns.
    ``fp32_precision`` matters only for float32 inputs (see :class:`~tracea.dtypes.Fp32Precision`).
    """

    kind: ClassVar[LayerType] = LayerType.GEMM
    roles: ClassVar[tuple[str, ...]] = ("a", "b", "bias")
    m: int
    n: int
    k: int
    batch: int = 1
    trans_a: bool = False
    trans_b: bool = False
    dtype_a: DType = DType.F32
    dtype_b: DType = DType.F32
    dtype_out: DType | None = None
    epilogue: Epilogue = field(default_factory=Epilogue.empty)  # type: ignore[assignment]
    fp32_precision: Fp32Precision = Fp32Precision.HIGHEST

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        _set_dtype(self, "dtype_a")
        _set_dtype(self, "dtype_b")
        if self.dtype_out is None:
            object.__setattr__(self, "dtype_out", self.dtype_a.storage)
        _set_dtype(self, "dtype_out")
        object.__setattr__(self, "epilogue", Epilogue.parse(self.epilogue))
        object.__setattr__(self, "fp32_precision", Fp32Precision.parse(self.fp32_precision))
        object.__setattr__(self, "trans_a", bool(self.trans_a))
        object.__setattr__(self, "trans_b", bool(self.trans_b))
        if self.dtype_a.storage != self.dtype_b.storage:
            raise InvalidArgumentError("b.dtype", self.dtype_b.value, f"the same dtype as a ({self.dtype_a.value})")

    @property
    def shape(self) -> Shape:
        return Shape(self.m, self.n, self.k, self.batch)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def min_bytes(self) -> int:
        a = self.batch * self.m * self.k * self.dtype_a.itemsize
        b = self.batch * self.k * self.n * self.dtype_b.itemsize
        c = self.batch * self.m * self.n * self.out_dtype.itemsize
        bias = self.n * self.out_dtype.itemsize if self.epilogue.has_bias else 0
        return a + b + c + bias

    @property
    def dtypes(self) -> tuple[DType, ...]:
        return (self.dtype_a.storage, self.dtype_b.storage)

    @property
    def out_dtype(self) -> DType:
        assert self.dtype_out is not None
        return self.dtype_out

    def describe(self) -> str:
        b = f"{self.batch}x" if self.batch > 1 else ""
        t = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        epi = "" if self.epilogue.is_empty else " +" + self.epilogue.key
        return f"gemm {b}{self.m}x{self.n}x{self.k} {t} {self.dtype_a.short}->{self.out_dtype.short}{epi}"


@memo_hash
@dataclass(frozen=True)
class Conv2dOp(Op):
    """2-D convolution (cross-correlation, as in PyTorch) of ``x`` (N, C, H, W logical) with ``w``
    (K, C/groups, R, S logical), optional bias of length K and a fused epilogue.

    ``layout`` is the physical order: NCHW (w stored KCRS) or NHWC (w stored KRSC, out NHWC).
    """

    kind: ClassVar[LayerType] = LayerType.CONV2D
    roles: ClassVar[tuple[str, ...]] = ("x", "w", "bias")
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    layout: Layout = Layout.NCHW
    dtype: DType = DType.F32
    dtype_out: DType | None = None
    epilogue: Epilogue = field(default_factory=Epilogue.empty)  # type: ignore[assignment]
    fp32_precision: Fp32Precision = Fp32Precision.HIGHEST

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s", "groups"):
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        object.__setattr__(self, "stride", _pair("stride", self.stride, True))
        object.__setattr__(self, "padding", _pair("padding", self.padding, False))
        object.__setattr__(self, "dilation", _pair("dilation", self.dilation, True))
        object.__setattr__(self, "layout", Layout.parse(self.layout))
        _set_dtype(self, "dtype")
        if self.dtype_out is None:
            object.__setattr__(self, "dtype_out", self.dtype.storage)
        _set_dtype(self, "dtype_out")
        object.__setattr__(self, "epilogue", Epilogue.parse(self.epilogue))
        object.__setattr__(self, "fp32_precision", Fp32Precision.parse(self.fp32_precision))
        if self.c % self.groups:
            raise InvalidArgumentError("groups", self.groups, f"a divisor of the input channels C={self.c}")
        if self.k % self.groups:
            raise InvalidArgumentError("groups", self.groups, f"a divisor of the output channels K={self.k}")
        for axis, size, pad, dil, ker in (("H", self.h, self.padding[0], self.dilation[0], self.r),
                                          ("W", self.w, self.padding[1], self.dilation[1], self.s)):
            if size + 2 * pad < dil * (ker - 1) + 1:
                raise InvalidArgumentError(
                    "w", f"kernel extent {dil * (ker - 1) + 1} on {axis}",
                    f"at most the padded input size {size + 2 * pad} on {axis}")

    @property
    def p(self) -> int:
        """Output height."""
        return (self.h + 2 * self.padding[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        """Output width."""
        return (self.w + 2 * self.padding[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        """Physical shape of the input array for this layout."""
        return (self.n, self.c, self.h, self.w) if self.layout is Layout.NCHW else (self.n, self.h, self.w, self.c)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        """Physical shape of the weight array (KCRS for NCHW, KRSC for NHWC)."""
        cg = self.c // self.groups
        return (self.k, cg, self.r, self.s) if self.layout is Layout.NCHW else (self.k, self.r, self.s, cg)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """Physical shape of the output array for this layout."""
        return (self.n, self.k, self.p, self.q) if self.layout is Layout.NCHW else (self.n, self.p, self.q, self.k)

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        """Implicit-GEMM view per group: M = N*P*Q, N = K/groups, K = C/groups*R*S."""
        return (self.n * self.p * self.q, self.k // self.groups, (self.c // self.groups) * self.r * self.s)

    @property
    def flops(self) -> int:
        m, n, k = self.gemm_mnk
        return 2 * m * n * k * self.groups

    @property
    def min_bytes(self) -> int:
        x = self.n * self.c * self.h * self.w * self.dtype.itemsize
        wt = self.k * (self.c // self.groups) * self.r * self.s * self.dtype.itemsize
        out = self.n * self.k * self.p * self.q * self.out_dtype.itemsize
        return x + wt + out + (self.k * self.out_dtype.itemsize if self.epilogue.has_bias else 0)

    @property
    def dtypes(self) -> tuple[DType, ...]:
        return (self.dtype.storage,)

    @property
    def out_dtype(self) -> DType:
        assert self.dtype_out is not None
        return self.dtype_out

    def describe(self) -> str:
        epi = "" if self.epilogue.is_empty else " +" + self.epilogue.key
        extra = ""
        if self.dilation != (1, 1):
            extra += f" d{self.dilation[0]}"
        if self.groups != 1:
            extra += f" g{self.groups}"
        return (f"conv2d {self.layout.name} n{self.n} {self.c}->{self.k} {self.h}x{self.w} "
                f"k{self.r}x{self.s}/s{self.stride[0]} p{self.padding[0]}{extra} {self.dtype.short}{epi}")


@memo_hash
@dataclass(frozen=True)
class AttentionOp(Op):
    """Scaled dot-product attention ``softmax(scale * Q K^T [+ mask]) V``.

    Arrays are (batch, heads, seq, head_dim) like ``torch.nn.functional.scaled_dot_product_attention``
    (``tracea.ops.attention`` folds any leading batch dimensions into ``batch``).
    ``kv_heads`` < ``heads`` is grouped-query attention (heads must be a multiple of kv_heads).
    ``causal`` masks key j > query i (top-left aligned, PyTorch's ``is_causal`` convention).
    ``scale`` defaults to 1/sqrt(head_dim); any finite float, as in PyTorch (kernels whose online softmax
    assumes a positive scale decline zero or negative ones, which the reference then computes).

    ``mask``: None, ``"bool"`` (a key takes part where the mask is non-zero; a masked key's logit is
    replaced by -inf, like the causal mask) or ``"additive"`` (added to the scaled logits in IEEE
    arithmetic). The kernels read it as a packed (mask_batch, mask_heads, seq_q, seq_kv) array of the
    input dtype, ``mask_shape = (mask_batch, mask_heads)`` each 1 (broadcast) or the full extent.
    ``dropout_p`` > 0 is described so dispatch can name it, but no Tracea kernel serves it.
    ``head_dim_v``: the head dim of V and the output when it differs from ``head_dim`` (else None).
    ``lse``: the kernel also writes the log-sum-exp of every query row, float32 (batch, heads, seq_q),
    natural log of ``sum_j exp(scale * q k_j^T + mask_j)`` over the visible keys (FlashAttention's
    ``softmax_lse``; -inf for a row whose keys are all masked), taken as the extra input role ``"lse"``
    (launchers then take ``(q, k, v, mask, lse, out)``).
    ``strides``: None when q, k, v and the output are packed; else 12 ints, the (batch, head, seq) element
    strides of q, k, v and the output in that order (head_dim unit-stride, a size-1 dimension's stride 0),
    as ``tracea.ops.attention`` hands the arrays to launchers (:mod:`tracea.runtime.attention_strides`):
    variants whose ``takes_strides(op)`` is true read them so, the others get packed arrays.
    """

    kind: ClassVar[LayerType] = LayerType.ATTENTION
    roles: ClassVar[tuple[str, ...]] = ("q", "k", "v", "mask")
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool = False
    scale: float | None = None
    kv_heads: int | None = None
    dtype: DType = DType.F32
    dtype_out: DType | None = None
    mask: str | None = field(default=None, metadata={"key_if_set": True})
    mask_shape: tuple[int, int] | None = field(default=None, metadata={"key_if_set": True})
    dropout_p: float = field(default=0.0, metadata={"key_if_set": True})
    head_dim_v: int | None = field(default=None, metadata={"key_if_set": True})
    lse: bool = field(default=False, metadata={"key_if_set": True})
    strides: tuple[int, ...] | None = field(default=None, metadata={"key_if_set": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "lse", bool(self.lse))
        if self.strides is not None:
            st = tuple(self.strides)
            if len(st) != 12 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in st):
                raise InvalidArgumentError("strides", self.strides, "None or 12 non-negative ints ((batch, head, seq) "
                                                                    "strides of q, k, v and out)")
            object.__setattr__(self, "strides", tuple(int(x) for x in st))
        if self.lse:  # the log-sum-exp array is one more role, after the mask
            object.__setattr__(self, "roles", AttentionOp.roles + ("lse",))
        for name in ("batch", "heads", "seq_q", "seq_kv", "head_dim"):
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        object.__setattr__(self, "kv_heads", check_positive("kv_heads", self.kv_heads or self.heads))
        if self.heads % int(self.kv_heads):  # type: ignore[arg-type]
            raise InvalidArgumentError("kv_heads", self.kv_heads, f"a divisor of heads={self.heads}")
        scale = 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise InvalidArgumentError("scale", self.scale, "a finite float")
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "causal", bool(self.causal))
        _set_dtype(self, "dtype")
        if self.dtype_out is None:
            object.__setattr__(self, "dtype_out", self.dtype.storage)
        _set_dtype(self, "dtype_out")
        if self.mask not in (None, "bool", "additive"):
            raise InvalidArgumentError("mask", self.mask, "None, 'bool' or 'additive'")
        if self.mask is None:
            object.__setattr__(self, "mask_shape", None)
        else:
            mb, mh = tuple(self.mask_shape or (1, 1))
            if mb not in (1, self.batch) or mh not in (1, self.heads):
                raise InvalidArgumentError("mask_shape", self.mask_shape,
                                           f"(1 or batch={self.batch}, 1 or heads={self.heads})")
            object.__setattr__(self, "mask_shape", (int(mb), int(mh)))
        p = self.dropout_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise InvalidArgumentError("dropout_p", p, "a probability in [0, 1]")
        object.__setattr__(self, "dropout_p", float(p))
        if self.head_dim_v is not None:
            dv = check_positive("head_dim_v", self.head_dim_v)
            object.__setattr__(self, "head_dim_v", None if dv == self.head_dim else dv)

    @property
    def epilogue(self) -> Epilogue:
        """Attention has no fused epilogue; always the empty chain."""
        return Epilogue.empty()

    @property
    def dv(self) -> int:
        """The head dim of V and of the output."""
        return self.head_dim if self.head_dim_v is None else int(self.head_dim_v)

    @property
    def unmasked_pairs(self) -> int:
        """Query/key pairs that contribute (all of them unless causal; a mask is not counted)."""
        if not self.causal:
            return self.seq_q * self.seq_kv
        # Row i sees keys 0..i (clipped to seq_kv).
        full = max(0, min(self.seq_q, self.seq_kv))
        tri = full * (full + 1) // 2
        return tri + max(0, self.seq_q - self.seq_kv) * self.seq_kv

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.heads * self.unmasked_pairs * (self.head_dim + self.dv)

    @property
    def min_bytes(self) -> int:
        item = self.dtype.itemsize
        kvh = int(self.kv_heads)  # type: ignore[arg-type]
        q = self.batch * self.heads * self.seq_q * self.head_dim * item
        kv = self.batch * kvh * self.seq_kv * (self.head_dim + self.dv) * item
        out = self.batch * self.heads * self.seq_q * self.dv * self.out_dtype.itemsize
        mask = 0
        if self.mask_shape is not None:
            mask = self.mask_shape[0] * self.mask_shape[1] * self.seq_q * self.seq_kv * item
        return q + kv + out + mask

    @property
    def dtypes(self) -> tuple[DType, ...]:
        return (self.dtype.storage,)

    @property
    def out_dtype(self) -> DType:
        assert self.dtype_out is not None
        return self.dtype_out

    def describe(self) -> str:
        c = " causal" if self.causal else ""
        m = f" {self.mask}-mask" if self.mask else ""
        dv = f"/{self.head_dim_v}" if self.head_dim_v is not None else ""
        drop = f" dropout {self.dropout_p:g}" if self.dropout_p else ""
        lse = " +lse" if self.lse else ""
        return (f"attention b{self.batch} h{self.heads} q{self.seq_q} kv{self.seq_kv} "
                f"d{self.head_dim}{dv}{c}{m}{drop}{lse} {self.dtype.short}")


def _set_dtype(op: Any, name: str) -> None:
    object.__setattr__(op, name, DType.parse(getattr(op, name), arg=name))


OP_TYPES: dict[str, type] = {"gemm": GemmOp, "conv2d": Conv2dOp, "attention": AttentionOp}


def op_from_dict(data: dict[str, Any]) -> Op:
    """Rebuild an op from :meth:`Op.to_dict` output (unknown keys raise ``InvalidArgumentError``)."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = OP_TYPES.get(str(kind).lower()) if kind is not None else None
    if cls is None:
        raise InvalidArgumentError("kind", kind, "one of " + ", ".join(OP_TYPES))
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise InvalidArgumentError(sorted(unknown)[0], data[sorted(unknown)[0]],
                                   f"a field of {cls.__name__}: " + ", ".join(sorted(names)))
    for key, value in list(data.items()):
        if isinstance(value, list):
            data[key] = tuple(value)
    return cls(**data)  # type: ignore[no-any-return]


__all__ = ["AttentionOp", "Conv2dOp", "GemmOp", "LayerType", "Layout", "Op", "OP_TYPES", "op_from_dict",
           "EpilogueKind", "asdict"]
