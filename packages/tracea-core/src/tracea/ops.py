"""Public operations on arrays: ``matmul``/``gemm``, ``conv2d`` and ``attention``.

Each accepts NumPy arrays (and CuPy arrays / torch tensors when their backends are installed), checks
its arguments, builds the op, asks the Doctor for a variant (tuned config from the cache, else the
variant's hero config) and runs it. The result is an array of the same kind as the inputs, written
into ``out`` when given. Arguments ``variant=`` and ``config=`` pin the choice (tests, experiments).

All of that happens once per call *signature* (array shapes, strides, dtypes and devices, and the other
arguments): the result is a plan kept in :mod:`tracea.runtime.plans`, and every later call with the same
signature runs the plan directly (a few microseconds of Python before the launch). The full path is in
:mod:`tracea.runtime.plan_ops`.
"""

from __future__ import annotations

from typing import Any

from .runtime import plan_attention, plan_conv_compat, plan_ops
from .runtime.dispatch import Quarantined
from .runtime.plans import _SIGS, _STATES, Uncacheable, lookup, signature, state
from .semantic.config import PipelineConfig


def matmul(a: Any, b: Any, *, bias: Any = None, epilogue: Any = None, activation: Any = None, out: Any = None,
           out_dtype: Any = None, fp32_precision: Any = None, variant: str | None = None,
           config: PipelineConfig | None = None) -> Any:
    """``epilogue(a @ b + bias)``.

    :param a: (m, k) or (batch, m, k). Column-major (transposed) operands are used without copying.
    :param b: (k, n) or (batch, k, n); a 2-D ``b`` with a 3-D ``a`` is shared across the batch.
    :param bias: optional length-n vector, added before the activations (a bias step is implied).
    :param epilogue: an :class:`Epilogue` or spec string (``"bias+gelu"``); ``activation`` appends one step.
    :param out: optional output array (m, n) / (batch, m, n) of the output dtype; must not overlap inputs.
    :param out_dtype: output dtype (default: the input dtype; ``out``'s dtype when ``out`` is given).
    :param fp32_precision: for float32 inputs: ``"highest"`` (fp32-accurate, default for NumPy),
        ``"high"`` (TF32 allowed) or ``"medium"``; torch tensors follow torch's setting by default.
    :returns: the result, of the inputs' array kind.
    """
    try:
        try:  # the signatures without a frame each in the common case (see plans.signature)
            sa, sb = _SIGS[type(a)](a), _SIGS[type(b)](b)
            sc = None if bias is None else _SIGS[type(bias)](bias)  # (a conditional: no call for the usual None)
            so = None if out is None else _SIGS[type(out)](out)
            st = _STATES[type(a)]()
        except KeyError:
            sa, sb, sc, so = signature(a), signature(b), signature(bias), signature(out)
            st = state(a)
        key: Any = ("matmul", sa, sb, sc, so, epilogue, activation, out_dtype, fp32_precision, variant, config, st)
        plan = lookup(key)
    except (Uncacheable, TypeError):  # an array kind without a signature, an unhashable argument
        key = plan = None
    if plan is not None:
        try:
            return plan(a, b, bias, out)
        except Quarantined:  # its variant failed at run time: decide again (the next candidate)
            pass
    return plan_ops.matmul(key, a, b, bias, epilogue, activation, out, out_dtype, fp32_precision, variant, config)


def gemm(a: Any, b: Any, bias: Any = None, epilogue: Any = None, **kwargs: Any) -> Any:
    """:func:`matmul` with ``bias`` and ``epilogue`` positional (``gemm(a, b, bias, "bias+relu")``)."""
    return matmul(a, b, bias=bias, epilogue=epilogue, **kwargs)


def conv2d(x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
           layout: str | None = None, epilogue: Any = None, activation: Any = None, out: Any = None,
           out_dtype: Any = None, fp32_precision: Any = None, variant: str | None = None,
           config: PipelineConfig | None = None) -> Any:
    """2-D convolution (cross-correlation, like ``torch.nn.functional.conv2d``) with a fused epilogue.

    :param x: input. NCHW: (N, C, H, W); NHWC: (N, H, W, C); unbatched (C, H, W) / (H, W, C) gives an
        unbatched result. torch tensors are always logically NCHW and channels_last memory selects the
        NHWC kernels.
    :param w: weight. NCHW: (K, C/groups, R, S); NHWC: (K, R, S, C/groups).
    :param b: optional bias of length K.
    :param stride: int or (sh, sw). ``padding``: int or (ph, pw) (zeros), or ``"valid"`` (0) or ``"same"``
        (stride 1; an odd total padding puts the extra row / column at the end, as PyTorch does).
        ``dilation``: int or pair.
    :param groups: channel groups (C and K must be divisible by it).
    :param layout: ``"NCHW"`` (default) or ``"NHWC"`` for arrays whose shapes are physical (NumPy, CuPy).
    :param activation: ``"relu"``, ``"gelu"``, ``"gelu_erf"`` or ``"silu"``, fused after the bias.
    :param fp32_precision: for float32 inputs: ``"highest"`` (default for NumPy / CuPy), ``"high"`` (TF32)
        or ``"medium"``; CUDA torch tensors follow ``torch.backends.cudnn.allow_tf32`` as ``F.conv2d`` does
        (TF32 by default), CPU torch tensors ``torch.get_float32_matmul_precision()``.
    :returns: the output, (N, K, P, Q) for NCHW or (N, P, Q, K) for NHWC.
    """
    try:
        try:  # (as matmul: no frame per signature in the common case)
            sx, sw = _SIGS[type(x)](x), _SIGS[type(w)](w)
            sb = None if b is None else _SIGS[type(b)](b)
            so = None if out is None else _SIGS[type(out)](out)
            st = _STATES[type(x)]()
        except KeyError:
            sx, sw, sb, so = signature(x), signature(w), signature(b), signature(out)
            st = state(x)
        key: Any = ("conv2d", sx, sw, sb, so, stride, padding, dilation, groups, layout, epilogue, activation,
                    out_dtype, fp32_precision, variant, config, st)
        plan = lookup(key)
    except (Uncacheable, TypeError):
        key = plan = None
    if plan is not None:
        try:
            return plan(x, w, b, out)
        except Quarantined:
            pass
    if plan_conv_compat.needs_adapting(x, padding):
        return plan_conv_compat.conv2d(key, x, w, b, stride, padding, dilation, groups, layout, out, dict(
            epilogue=epilogue, activation=activation, out_dtype=out_dtype, fp32_precision=fp32_precision,
            variant=variant, config=config))
    return plan_ops.conv2d(key, x, w, b, stride, padding, dilation, groups, layout, epilogue, activation, out,
                           out_dtype, fp32_precision, variant, config)


def attention(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False, *, causal: bool | None = None, out: Any = None,
              variant: str | None = None, config: PipelineConfig | None = None, return_lse: bool = False) -> Any:
    """Scaled dot-product attention with the arguments of ``torch.nn.functional.scaled_dot_product_attention``.

    ``softmax(q @ k^T * scale + mask) @ v`` over the last two dimensions.

    :param q: (..., heads, seq_q, head_dim): any leading (batch) dimensions, none for 3-D input.
    :param k: (..., kv_heads, seq_kv, head_dim); ``v``: (..., kv_heads, seq_kv, head_dim_v). Leading
        dimensions of q, k and v broadcast against each other. kv_heads must divide heads
        (grouped-query attention, always allowed: ``enable_gqa`` is accepted for compatibility).
    :param attn_mask: optional mask broadcastable to (..., heads, seq_q, seq_kv): boolean (True: the key
        takes part) or additive (a floating array added to the scaled logits). A mask the kernels cannot
        read as it is (boolean, another dtype, broadcast over seq_q, strided) is converted into a packed
        array; for torch tensors the conversion is reused while the same mask tensor is passed again
        unchanged (its version counter: any in-place torch op counts; writes torch does not see, through
        ``.data`` or DLPack, do not), never inside a CUDA graph capture. A mask object that describes a
        causal mask (torch's ``CausalBias``) is read for what it stands for (upper-left: ``is_causal``).
    :param dropout_p: dropout probability; no Tracea kernel applies dropout, so a non-zero value is
        computed by PyTorch for torch tensors (counted in the fallback counters) and raises
        :class:`~tracea.errors.NoVariantError` for other arrays.
    :param is_causal: mask keys after each query, top-left aligned (key j is visible to query i when
        j <= i, also when seq_q != seq_kv), as PyTorch's ``is_causal``; ``causal`` is an alias.
        Unlike PyTorch, it may be combined with ``attn_mask`` (both apply).
    :param scale: logits scale, default 1/sqrt(head_dim).
    :param out: optional output array of the result's shape and q's dtype.
    :param return_lse: also return the log-sum-exp of every query row (for a backward pass): float32
        (..., heads, seq_q), the natural log of ``sum_j exp(scale * q k_j^T + mask_j)`` over the keys the
        row sees, as FlashAttention's ``softmax_lse``; -inf for a row whose keys are all masked (its
        output row is 0). Served by the CUDA kernels (``cuda.attention.wgmma`` / ``flash_mma`` /
        ``decode``), the CPU kernel and the float64 reference; a call that only a framework fallback
        would compute (e.g. ``dropout_p`` > 0) raises :class:`~tracea.errors.NoVariantError`.
    :returns: (..., heads, seq_q, head_dim_v), of q's dtype and array kind; with ``return_lse`` the pair
        ``(out, lse)``.
    """
    if causal is not None:
        is_causal = causal
    try:
        try:  # the signatures without a frame each in the common case (see plans.signature)
            sq, sk, sv, sm, so = (_SIGS[type(q)](q), _SIGS[type(k)](k), _SIGS[type(v)](v),
                                  None if attn_mask is None else _SIGS[type(attn_mask)](attn_mask),
                                  None if out is None else _SIGS[type(out)](out))
        except KeyError:
            sq, sk, sv, sm, so = signature(q), signature(k), signature(v), signature(attn_mask), signature(out)
        key: Any = ("attention", sq, sk, sv, sm, so, dropout_p, is_causal, scale, enable_gqa, variant, config)
        if return_lse:
            key += ("lse", return_lse)
        plan = lookup(key)
    except (Uncacheable, TypeError):
        key = plan = None
    if plan is not None:
        try:
            return plan(q, k, v, attn_mask, out)
        except Quarantined:
            pass
    return plan_attention.attention(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, out, variant,
                                    config, return_lse)


__all__ = ["attention", "conv2d", "gemm", "matmul"]
