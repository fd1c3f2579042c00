"""NumPy reference kernels with float64 accumulation: the correctness oracle of every test and the
last-resort fallback for host arrays. Clarity over speed, but vectorised enough for test-sized shapes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..ir.epilogue import Epilogue, EpilogueKind
from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, Layout

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # type: ignore[import-not-found]

        return erf(x)  # type: ignore[no-any-return]
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)


def apply_epilogue(acc: np.ndarray, epilogue: Epilogue, bias: np.ndarray | None, axis: int = -1) -> np.ndarray:
    """Apply ``epilogue`` to a float64 accumulator; the bias broadcasts along ``axis``.

    NaN and Inf propagate by IEEE arithmetic, as in PyTorch: relu(NaN) = NaN, relu(-inf) = 0,
    gelu(+inf) = silu(+inf) = +inf, gelu(-inf) = silu(-inf) = NaN (-inf * 0, -inf / inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _apply_steps(acc, epilogue, bias, axis)


def _apply_steps(acc: np.ndarray, epilogue: Epilogue, bias: np.ndarray | None, axis: int) -> np.ndarray:
    y = acc
    for step in epilogue:
        if step is EpilogueKind.BIAS:
            if bias is None:
                raise ValueError("epilogue has a bias step but no bias was given")
            shape = [1] * y.ndim
            shape[axis] = -1
            y = y + np.asarray(bias, dtype=np.float64).reshape(shape)
        elif step is EpilogueKind.RELU:
            y = np.maximum(y, 0.0)  # NaN-propagating, like torch.relu
        elif step is EpilogueKind.GELU_TANH:
            y = 0.5 * y * (1.0 + np.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y**3)))
        elif step is EpilogueKind.GELU_ERF:
            y = 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0)))
        elif step is EpilogueKind.SILU:
            y = y / (1.0 + np.exp(-y))
        else:  # pragma: no cover - exhaustive
            raise ValueError(f"unknown epilogue step {step}")
    return y


def gemm(op: GemmOp, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``epilogue(op(a) @ op(b))`` in float64. ``a`` is (batch, m, k) or (batch, k, m) if ``trans_a``
    (a leading batch axis of 1 may be omitted); same for ``b``. Returns float64 (batch, m, n)."""
    a64 = np.asarray(a, dtype=np.float64).reshape(op.batch, *((op.k, op.m) if op.trans_a else (op.m, op.k)))
    b64 = np.asarray(b, dtype=np.float64).reshape(op.batch, *((op.n, op.k) if op.trans_b else (op.k, op.n)))
    if op.trans_a:
        a64 = np.swapaxes(a64, -1, -2)
    if op.trans_b:
        b64 = np.swapaxes(b64, -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf operands: IEEE results, no warnings
        acc = np.matmul(a64, b64)
    return apply_epilogue(acc, op.epilogue, bias, axis=-1)


def conv2d(op: Conv2dOp, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Cross-correlation in float64 for either layout; returns the output in ``op.layout`` order."""
    x64 = np.asarray(x, dtype=np.float64).reshape(op.x_shape)
    w64 = np.asarray(w, dtype=np.float64).reshape(op.w_shape)
    if op.layout is Layout.NHWC:  # work in NCHW / KCRS
        x64 = x64.transpose(0, 3, 1, 2)
        w64 = w64.transpose(0, 3, 1, 2)
    ph, pw = op.padding
    xp = np.pad(x64, ((0, 0), (0, 0), (ph, ph), (pw, pw)))  # zeros: 0 * Inf = NaN there, as in PyTorch
    out = np.empty((op.n, op.k, op.p, op.q), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf operands: IEEE results, no warnings
        _conv_groups(op, xp, w64, out)
    out = apply_epilogue(out, op.epilogue, bias, axis=1)
    return out.transpose(0, 2, 3, 1) if op.layout is Layout.NHWC else out


def _conv_groups(op: Conv2dOp, xp: np.ndarray, w64: np.ndarray, out: np.ndarray) -> None:
    (sh, sw), (dh, dw) = op.stride, op.dilation
    g, cg, kg = op.groups, op.c // op.groups, op.k // op.groups
    for gi in range(g):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w64[gi * kg:(gi + 1) * kg]  # (kg, cg, r, s)
        acc = np.zeros((op.n, kg, op.p, op.q), dtype=np.float64)
        for r in range(op.r):
            for s in range(op.s):
                h0, w0 = r * dh, s * dw
                patch = xs[:, :, h0:h0 + sh * (op.p - 1) + 1:sh, w0:w0 + sw * (op.q - 1) + 1:sw]  # (n, cg, p, q)
                acc += np.einsum("ncpq,kc->nkpq", patch, ws[:, :, r, s], optimize=True)
        out[:, gi * kg:(gi + 1) * kg] = acc


def attention(op: AttentionOp, q: np.ndarray, k: np.ndarray, v: np.ndarray,
              mask: np.ndarray | None = None, *, return_lse: bool = False) -> Any:
    """Softmax attention in float64 with PyTorch's top-left causal convention; returns (B, H, Sq, Dv),
    or with ``return_lse`` the pair (out, lse): lse (B, H, Sq) float64, the natural log of the sum of
    ``exp`` of the scaled, masked logits of each row (-inf for a row whose logits are all -inf, NaN for
    a row with a NaN or +inf logit).

    ``mask`` (op.mask set): (mask_batch, mask_heads, Sq, Skv); a ``"bool"`` mask keeps the keys where it is
    non-zero and replaces the others' logits by -inf (as the causal mask does), an ``"additive"`` one is
    added to the scaled logits.

    NaN and Inf: ``softmax(masked_fill(scale q k^T, mask, -inf)) @ v`` in IEEE arithmetic, as PyTorch
    computes it: a NaN or +inf logit makes its row NaN, a masked key's logit is replaced (its k never
    matters) while its weight 0 still multiplies its v (0 x NaN = 0 x Inf = NaN), and a row whose
    logits are all -inf gets weights 0 (PyTorch's convention for fully masked rows), not 0/0."""
    kvh = int(op.kv_heads or op.heads)
    q64 = np.asarray(q, dtype=np.float64).reshape(op.batch, op.heads, op.seq_q, op.head_dim)
    k64 = np.asarray(k, dtype=np.float64).reshape(op.batch, kvh, op.seq_kv, op.head_dim)
    v64 = np.asarray(v, dtype=np.float64).reshape(op.batch, kvh, op.seq_kv, op.dv)
    rep = op.heads // kvh
    if rep > 1:
        k64 = np.repeat(k64, rep, axis=1)
        v64 = np.repeat(v64, rep, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf operands: IEEE results, no warnings
        s = np.einsum("bhqd,bhkd->bhqk", q64, k64, optimize=True) * float(op.scale)  # type: ignore[arg-type]
        if op.causal:
            hidden = np.arange(op.seq_kv)[None, :] > np.arange(op.seq_q)[:, None]
            s = np.where(hidden, -np.inf, s)
        if op.mask is not None:
            if mask is None:
                raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
            mb, mh = op.mask_shape or (1, 1)
            m64 = np.asarray(mask, dtype=np.float64).reshape(mb, mh, op.seq_q, op.seq_kv)
            s = np.where(m64 != 0, s, -np.inf) if op.mask == "bool" else s + m64
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - np.where(m == -np.inf, 0.0, m))  # all -inf: exp(-inf) = 0, not exp(NaN)
        total = p.sum(axis=-1, keepdims=True)
        p /= np.where(total == 0.0, 1.0, total)
        out = np.einsum("bhqk,bhkd->bhqd", p, v64, optimize=True)
        if not return_lse:
            return out
        with np.errstate(divide="ignore"):  # log(0) = -inf: every logit of the row was -inf
            lse = (np.where(m == -np.inf, 0.0, m) + np.log(total))[..., 0]
        return out, lse
