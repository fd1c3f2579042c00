"""Strided attention operands: q, k and v as models hand them to ``scaled_dot_product_attention``.

Hugging Face models pass ``x.view(B, S, H, D).transpose(1, 2)`` (a (batch, heads, seq, head_dim) view of
(batch, seq, heads, head_dim) memory, "BSHD"), timm's ViT three such views into one packed qkv buffer.
:func:`tracea.ops.attention` describes their layout in :attr:`~tracea.ir.ops.AttentionOp.strides`
(the (batch, head, seq) element strides of q, k, v and the output; head_dim unit-stride), and:

* a variant whose :meth:`~tracea.doctor.variant.KernelVariant.takes_strides` is true for the op gets the
  arrays as they are (its launcher reads them through their data pointers and the op's strides);
* any other variant is given packed arrays: :func:`packing_launcher` (installed by
  :func:`tracea.runtime.dispatch.bind`) copies the strided operands into packed ones and, when the output
  is not packed, launches into a packed array and copies it into the output.

The output of a strided signature whose q is BSHD-like is allocated in q's storage order (as PyTorch's
flash / cuDNN SDPA does), so the model's ``out.transpose(1, 2).reshape(B, S, H * D)`` is a view.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

#: the strides of one operand: elements from one batch / head / sequence position to the next
Triple = tuple[int, int, int]


def fold(shape: Sequence[int], strides: Sequence[int] | None) -> Triple | None:
    """The (batch, head, seq) element strides of an array (..., heads, seq, head_dim) whose head_dim is
    unit-stride and whose leading dimensions fold into one batch dimension; None otherwise (unknown or
    negative strides, a strided head_dim, leading dimensions that do not nest). A dimension of size 1
    gets stride 0 (its stride is never used)."""
    if strides is None or len(shape) < 3 or len(strides) != len(shape):
        return None
    if any(int(s) < 0 for s in strides) or (shape[-1] > 1 and strides[-1] != 1):
        return None
    *lead, h, s, _ = (int(x) for x in shape)
    *lstr, sh, ss, _ = (int(x) for x in strides)
    sb, inner = 0, None  # inner: (size, stride) of the last non-1 leading dim seen (innermost first)
    for size, st in zip(reversed(lead), reversed(lstr)):
        if size == 1:
            continue
        if inner is None:
            sb = st
        elif st != inner[0] * inner[1]:
            return None
        inner = (size, st)
    return (sb, sh if h > 1 else 0, ss if s > 1 else 0)


def packed(heads: int, seq: int, dim: int, batch: int = 2) -> Triple:
    """The strides of a packed (batch, heads, seq, dim) array (size-1 dims 0, like :func:`fold`)."""
    return (heads * seq * dim if batch > 1 else 0, seq * dim if heads > 1 else 0, dim if seq > 1 else 0)


def bshd_like(triple: Triple | None) -> bool:
    """Whether an operand's heads are inner to its sequence positions (memory (batch, seq, heads, dim))."""
    return triple is not None and 0 < triple[1] < triple[2]


def packing_launcher(launch: Callable[..., None], op: Any, adapter: Any) -> Callable[..., None]:
    """``launch`` (a variant that reads packed arrays) for an op with :attr:`AttentionOp.strides`: q, k
    and v are copied into packed arrays when they are not packed; an output that is not packed gets the
    result through a packed temporary. Launchers take ``(q, k, v, mask[, lse], out)``."""
    kvh = int(op.kv_heads or op.heads)
    shapes = ((op.batch, op.heads, op.seq_q, op.head_dim), (op.batch, kvh, op.seq_kv, op.head_dim),
              (op.batch, kvh, op.seq_kv, op.dv))
    oshape = (op.batch, op.heads, op.seq_q, op.dv)
    contiguous, reshape, info, empty, copy_ = (adapter.contiguous, adapter.reshape, adapter.info, adapter.empty,
                                               adapter.copy_)

    def launch_packed(*arrays: Any) -> None:
        *ins, out = arrays
        qkv = [reshape(contiguous(x), s) for x, s in zip(ins[:3], shapes)]
        if info(out).c_contiguous:
            launch(*qkv, *ins[3:], reshape(out, oshape))
            return
        tmp = empty(oshape, op.out_dtype, out)
        launch(*qkv, *ins[3:], tmp)
        copy_(out if tuple(info(out).shape) == oshape else reshape(out, oshape), tmp)

    return launch_packed


def of_arrays(adapter: Any, op: Any, q: Any, k: Any, v: Any, out: Any) -> tuple[int, ...] | None:
    """The :attr:`AttentionOp.strides` that describe these arrays (None when all four are packed, or
    when one does not fold): what a variant's ``run`` (arrays from the tuner, packed, or from a plan,
    strided) actually holds."""
    triples: list[int] = []
    all_packed = True
    for x in (q, k, v, out):
        i = adapter.info(x)
        t = fold(i.shape, i.strides)
        if t is None:
            return None
        all_packed = all_packed and i.c_contiguous
        triples.extend(t)
    return None if all_packed else tuple(triples)


__all__ = ["Triple", "bshd_like", "fold", "of_arrays", "packed", "packing_launcher"]
