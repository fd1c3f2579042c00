"""Public operations on arrays: ``matmul``/``gemm``, ``conv2d`` and ``attention``.

Each accepts NumPy arrays (and CuPy arrays / torch tensors when their backends are installed), checks
its arguments, builds the op, asks the Doctor for a variant (tuned config from the cache, else the
variant's hero config) and runs it. The result is an array of the same kind as the inputs, written
into ``out`` when given. Arguments ``variant=`` and ``config=`` pin the choice (tests, experiments).
"""

from __future__ import annotations

import numbers
from typing import Any

from .doctor.doctor import get_doctor
from .dtypes import DType, Fp32Precision
from .errors import InvalidArgumentError, ShapeError
from .ir.epilogue import Epilogue, EpilogueKind
from .ir.ops import AttentionOp, Conv2dOp, GemmOp, Layout
from .runtime import operands as ops_args
from .runtime.dispatch import execute
from .semantic.config import PipelineConfig


def _epilogue(epilogue: Any, activation: Any, has_bias: bool) -> Epilogue:
    epi = Epilogue.parse(epilogue)
    if activation is not None:
        epi = Epilogue(epi.steps + Epilogue.parse(activation, "activation").steps)
    if has_bias and not epi.has_bias:
        epi = Epilogue((EpilogueKind.BIAS,) + epi.steps)
    if epi.has_bias and not has_bias:
        raise InvalidArgumentError("bias", None, "a bias array, since the epilogue has a bias step")
    return epi


def _precision(value: Any, adapter: Any) -> Fp32Precision:
    if value is not None:
        return Fp32Precision.parse(value)
    return Fp32Precision.parse(adapter.fp32_precision() or Fp32Precision.HIGHEST)


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
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("a", a), ("b", b), ("bias", bias), ("out", out)])
    A, B = o["a"], o["b"]
    ops_args.check_rank(A, (2, 3), "(m, k) or (batch, m, k)")
    ops_args.check_rank(B, (2, 3), "(k, n) or (batch, k, n)")
    ops_args.check_float(A)
    ops_args.same_dtype(A, B)
    *ba, m, k = A.info.shape
    *bb, k2, n = B.info.shape
    if k2 != k:
        raise ShapeError("b", b, f"shape ({'batch, ' if bb else ''}{k}, n) to match a's k={k}")
    if ba and bb and ba != bb:
        raise ShapeError("b", b, f"batch {ba[0]} like a")
    if bb and not ba:
        raise ShapeError("a", a, f"a 3-D (batch={bb[0]}, m, k) array when b is 3-D (broadcast a explicitly)")
    batch = ba[0] if ba else 1
    dtype_out = ops_args.check_out_dtype(DType.parse(out_dtype, "out_dtype")) if out_dtype is not None else (
        o["out"].info.dtype if "out" in o else A.info.dtype)
    out_shape = (batch, m, n) if ba else (m, n)
    ops_args.check_out(o.get("out"), out_shape, dtype_out)
    ops_args.check_no_overlap(o.get("out"), [A, B, o.get("bias")])
    epi = _epilogue(epilogue, activation, "bias" in o)
    bias_arr = ops_args.bias_operand(o.get("bias"), n, dtype_out, "one value per output column")

    a_arr, ta = ops_args.packed_maybe_transposed(A)
    b_arr, tb = ops_args.packed_maybe_transposed(B)
    gemm_m, gemm_batch = m, batch
    if ba and not bb:  # (batch, m, k) @ (k, n) is one GEMM with M = batch*m
        if ta:
            a_arr, ta = adapter.contiguous(A.obj), False
        a_arr = adapter.reshape(a_arr, (batch * m, k))
        gemm_m, gemm_batch = batch * m, 1
    op = GemmOp(gemm_m, n, k, gemm_batch, trans_a=ta, trans_b=tb, dtype_a=A.info.dtype, dtype_b=B.info.dtype,
                dtype_out=dtype_out, epilogue=epi, fp32_precision=_precision(fp32_precision, adapter))
    user_out = o["out"].obj if "out" in o else adapter.empty(out_shape, dtype_out, like=A.obj)
    target = user_out if "out" not in o or o["out"].info.c_contiguous else adapter.empty(out_shape, dtype_out, A.obj)
    kernel_out = adapter.reshape(target, (gemm_batch, gemm_m, n)) if gemm_batch > 1 else adapter.reshape(target, (gemm_m, n))
    result = execute(op, {"a": a_arr, "b": b_arr, "bias": bias_arr}, kernel_out, adapter, device,
                     variant=variant, config=config, doctor=doctor, user_arrays={"a": a, "b": b, "bias": bias_arr})
    if result is not kernel_out:  # a framework fallback computed it
        if "out" not in o:
            return result
        target = result
    if target is not user_out:
        adapter.copy_(user_out, target)
    return user_out


def gemm(a: Any, b: Any, bias: Any = None, epilogue: Any = None, **kwargs: Any) -> Any:
    """:func:`matmul` with ``bias`` and ``epilogue`` positional (``gemm(a, b, bias, "bias+relu")``)."""
    return matmul(a, b, bias=bias, epilogue=epilogue, **kwargs)


def conv2d(x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
           layout: str | None = None, epilogue: Any = None, activation: Any = None, out: Any = None,
           out_dtype: Any = None, fp32_precision: Any = None, variant: str | None = None,
           config: PipelineConfig | None = None) -> Any:
    """2-D convolution (cross-correlation, like ``torch.nn.functional.conv2d``) with a fused epilogue.

    :param x: input. NCHW: (N, C, H, W); NHWC: (N, H, W, C). torch tensors are always logically NCHW
        and channels_last memory selects the NHWC kernels.
    :param w: weight. NCHW: (K, C/groups, R, S); NHWC: (K, R, S, C/groups).
    :param b: optional bias of length K.
    :param stride: int or (sh, sw). ``padding``: int or (ph, pw) (zeros). ``dilation``: int or pair.
    :param groups: channel groups (C and K must be divisible by it).
    :param layout: ``"NCHW"`` (default) or ``"NHWC"`` for arrays whose shapes are physical (NumPy, CuPy).
    :param activation: ``"relu"``, ``"gelu"``, ``"gelu_erf"`` or ``"silu"``, fused after the bias.
    :returns: the output, (N, K, P, Q) for NCHW or (N, P, Q, K) for NHWC.
    """
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("x", x), ("w", w), ("b", b), ("out", out)])
    X, W = o["x"], o["w"]
    ops_args.check_rank(X, (4,), "(N, C, H, W) or (N, H, W, C)")
    ops_args.check_rank(W, (4,), "(K, C/groups, R, S) or (K, R, S, C/groups)")
    ops_args.check_float(X)
    ops_args.same_dtype(X, W)
    logical = bool(getattr(adapter, "logical_nchw", False))
    if logical:
        if layout is not None and Layout.parse(layout) is Layout.NHWC:
            raise InvalidArgumentError("layout", layout, "None for torch tensors (use channels_last memory)")
        lay = Layout.NHWC if _is_channels_last(X) else Layout.NCHW
        x_arr = ops_args.packed(X) if lay is Layout.NCHW else adapter.permute(X.obj, (0, 2, 3, 1))
        if lay is Layout.NHWC and not adapter.info(x_arr).c_contiguous:
            x_arr = adapter.contiguous(x_arr)
        w_arr = ops_args.packed(W) if lay is Layout.NCHW else adapter.contiguous(adapter.permute(W.obj, (0, 2, 3, 1)))
        n, c, h, wd = X.info.shape
        k, cg, r, s = W.info.shape
    else:
        lay = Layout.parse(layout or "NCHW")
        x_arr, w_arr = ops_args.packed(X), ops_args.packed(W)
        if lay is Layout.NCHW:
            n, c, h, wd = X.info.shape
            k, cg, r, s = W.info.shape
        else:
            n, h, wd, c = X.info.shape
            k, r, s, cg = W.info.shape
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups <= 0:  # NumPy ints too
        raise InvalidArgumentError("groups", groups, "a positive integer")
    if cg * groups != c:
        raise ShapeError("w", w, f"C/groups = {c}/{groups} input channels per group (got {cg})")
    dtype_out = ops_args.check_out_dtype(DType.parse(out_dtype, "out_dtype")) if out_dtype is not None else (
        o["out"].info.dtype if "out" in o else X.info.dtype)
    op = Conv2dOp(n, c, h, wd, k, r, s, stride=ops_args.pair("stride", stride),
                  padding=ops_args.pair("padding", padding), dilation=ops_args.pair("dilation", dilation),
                  groups=int(groups), layout=lay, dtype=X.info.dtype, dtype_out=dtype_out,
                  epilogue=_epilogue(epilogue, activation, "b" in o),
                  fp32_precision=_precision(fp32_precision, adapter))
    user_shape = (n, k, op.p, op.q) if (logical or lay is Layout.NCHW) else op.out_shape
    ops_args.check_out(o.get("out"), user_shape, dtype_out)
    ops_args.check_no_overlap(o.get("out"), [X, W, o.get("b")])
    bias_arr = ops_args.bias_operand(o.get("b"), k, dtype_out, "one value per output channel")
    phys = adapter.empty(op.out_shape, dtype_out, like=X.obj)
    result = execute(op, {"x": x_arr, "w": w_arr, "bias": bias_arr}, phys, adapter, device, variant=variant,
                     config=config, doctor=doctor, user_arrays={"x": x, "w": w, "bias": bias_arr})
    if result is not phys:  # a framework fallback computed it in the user's layout
        if "out" in o and result is not o["out"].obj:
            adapter.copy_(o["out"].obj, result)
            return o["out"].obj
        return result
    res = adapter.permute(phys, (0, 3, 1, 2)) if (logical and lay is Layout.NHWC) else phys
    if "out" in o:
        adapter.copy_(o["out"].obj, res)
        return o["out"].obj
    return res


def _is_channels_last(op: ops_args.Operand) -> bool:
    st, (n, c, h, w) = op.info.strides, op.info.shape
    if st is None or c == 1 or op.info.c_contiguous:
        return False
    return st[1] == 1 and (h == 1 or st[2] == w * c) and (w == 1 or st[3] == c)


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None, out: Any = None,
              variant: str | None = None, config: PipelineConfig | None = None) -> Any:
    """Scaled dot-product attention, like ``torch.nn.functional.scaled_dot_product_attention``.

    :param q: (batch, heads, seq_q, head_dim) or (heads, seq_q, head_dim).
    :param k: (batch, kv_heads, seq_kv, head_dim); ``v`` likewise. kv_heads must divide heads (GQA).
    :param causal: mask keys after each query (top-left aligned, as PyTorch's ``is_causal``).
    :param scale: logits scale, default 1/sqrt(head_dim).
    :returns: (batch, heads, seq_q, head_dim) (or 3-D for 3-D inputs), of q's dtype.
    """
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("q", q), ("k", k), ("v", v), ("out", out)])
    Q, K, V = o["q"], o["k"], o["v"]
    for t in (Q, K, V):
        ops_args.check_rank(t, (3, 4), "(batch, heads, seq, head_dim)")
    ops_args.check_float(Q)
    ops_args.same_dtype(Q, K, V)
    if not (Q.info.ndim == K.info.ndim == V.info.ndim):
        raise ShapeError("k", k, f"a {Q.info.ndim}-D array like q")
    shp = lambda t: t.info.shape if t.info.ndim == 4 else (1,) + tuple(t.info.shape)  # noqa: E731
    bq, hq, sq, d = shp(Q)
    bk, hk, sk, dk = shp(K)
    if (bk, dk) != (bq, d):
        raise ShapeError("k", k, f"batch {bq} and head_dim {d} like q")
    if tuple(shp(V)) != (bk, hk, sk, dk):
        raise ShapeError("v", v, f"the shape of k {tuple(K.info.shape)}")
    if hq % hk:
        raise ShapeError("k", k, f"kv heads dividing q's {hq} heads")
    op = AttentionOp(bq, hq, sq, sk, d, causal=bool(causal), scale=scale, kv_heads=hk, dtype=Q.info.dtype)
    ops_args.check_out(o.get("out"), tuple(Q.info.shape), Q.info.dtype)
    ops_args.check_no_overlap(o.get("out"), [Q, K, V])
    target = o["out"].obj if "out" in o and o["out"].info.c_contiguous else adapter.empty(Q.info.shape, Q.info.dtype, Q.obj)
    result = execute(op, {"q": ops_args.packed(Q), "k": ops_args.packed(K), "v": ops_args.packed(V)}, target,
                     adapter, device, variant=variant, config=config, doctor=doctor,
                     user_arrays={"q": q, "k": k, "v": v})
    if result is not target:  # a framework fallback computed it
        if "out" not in o:
            return result
        target = result
    if "out" in o and target is not o["out"].obj:
        adapter.copy_(o["out"].obj, target)
        return o["out"].obj
    return target


__all__ = ["attention", "conv2d", "gemm", "matmul"]
