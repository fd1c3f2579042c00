"""PyTorch eager implementations of Tracea's ops: what a call falls back to when no Tracea variant
serves it, and the baseline :func:`tracea_torch.tune` compares against.

They follow the op description exactly (layouts, transposes, epilogue order, output dtype), so a
fallback result is interchangeable with a variant's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch
import torch.nn.functional as F

from tracea.dtypes import DType, Fp32Precision
from tracea.ir.epilogue import Epilogue, EpilogueKind
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp, Layout, Op

from .adapter import torch_dtype
from .compat import torch_version

def _gelu_erf(t: torch.Tensor) -> torch.Tensor:
    # torch's vectorised float32/bfloat16 CPU GELU gives NaN for +inf (float64 gives +inf, the limit).
    return torch.where(torch.isposinf(t), t, F.gelu(t))


ACTIVATIONS = {
    EpilogueKind.RELU: torch.relu,
    EpilogueKind.GELU_TANH: lambda t: F.gelu(t, approximate="tanh"),
    EpilogueKind.GELU_ERF: _gelu_erf,
    EpilogueKind.SILU: F.silu,
}
_PRECISION = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}


def _cast(t: torch.Tensor, dtype: DType) -> torch.Tensor:
    want = torch_dtype(dtype)
    return t if t.dtype == want else t.to(want)


def compute_dtype(inputs: torch.dtype, out: DType) -> torch.dtype:
    """The dtype to compute in: the inputs' unless the output is more precise (float16 inputs with a
    float32 output accumulate and apply the epilogue in float32, as Tracea's kernels do); float16 <->
    bfloat16 in float32."""
    want = torch_dtype(out)
    have, rank = _PRECISION.get(inputs, 0), _PRECISION.get(want, 0)
    if want == inputs or rank < have:
        return inputs
    return want if rank > have else torch.float32


def apply_epilogue(acc: torch.Tensor, epilogue: Epilogue | tuple[EpilogueKind, ...], bias: torch.Tensor | None,
                   channel_dim: int) -> torch.Tensor:
    """Apply the steps of ``epilogue`` in order; the bias runs along ``channel_dim``."""
    for step in epilogue:
        if step is EpilogueKind.BIAS:
            if bias is None:
                raise ValueError("epilogue has a bias step but no bias was given")
            shape = [1] * acc.dim()
            shape[channel_dim] = -1
            acc = acc + bias.reshape(shape).to(acc.dtype)
        else:
            acc = ACTIVATIONS[step](acc)
    return acc


def _cudnn_exact(op: Op, t: torch.Tensor) -> Any:
    """cuDNN without TF32 for a float32 op that asks for fp32 accuracy (cuDNN's own default is TF32)."""
    import contextlib

    if t.is_cuda and t.dtype == torch.float32 and op.fp32_precision is Fp32Precision.HIGHEST:  # type: ignore[attr-defined]
        return torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False)
    return contextlib.nullcontext()


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the exact row-major strides and a 16-byte aligned start: ``contiguous()`` keeps a tensor
    whose size-1 dims have odd strides (a one-channel channels_last tensor: PyTorch then still takes its
    NHWC path) and keeps a view's storage offset (PyTorch's CUDA SDPA kernels assume 16-byte aligned
    rows: a view starting 4 bytes in gave 'misaligned address', which ends the CUDA context, or
    'cutlassF: no kernel found'; found by tracea.fuzzing)."""
    if _row_major(t) and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def conv2d(op: Conv2dOp, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``op`` on arrays in its physical layout (NCHW/KCRS or NHWC/KRSC); result in that layout."""
    if op.layout is Layout.NHWC:
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    dt = compute_dtype(x.dtype, op.out_dtype)
    cpu_nhwc = False
    if not x.is_cuda:
        # PyTorch's CPU convolution (oneDNN) returns wrong values for some shapes (torch 2.13 on an AMX
        # Xeon, found by tracea.fuzzing: 1-channel 7x7 input, 5x5 kernel, stride (1, 3), output width 1:
        # errors ~20 in bfloat16, and in float32 when the input is channels_last). Its float32 NCHW path
        # is right there; float32 accumulation is also what Tracea's kernels do. So a CPU fallback computes
        # in float32 on NCHW-contiguous copies and gives back the caller's memory format.
        if dt in (torch.float16, torch.bfloat16):
            dt = torch.float32
        cpu_nhwc = op.layout is Layout.NCHW and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        x, w = _dense(x), _dense(w)
    x, w = x.to(dt), w.to(dt)
    fused_bias = bias.to(dt) if bias is not None and op.epilogue.steps[:1] == (EpilogueKind.BIAS,) else None
    with _cudnn_exact(op, x):
        acc = F.conv2d(x, w, fused_bias, op.stride, op.padding, op.dilation, op.groups)
    rest = op.epilogue.steps[1:] if fused_bias is not None else op.epilogue.steps
    out = _cast(apply_epilogue(acc, rest, bias, 1), op.out_dtype)
    if cpu_nhwc:
        out = out.contiguous(memory_format=torch.channels_last)
    return out.permute(0, 2, 3, 1) if op.layout is Layout.NHWC else out


def gemm(op: GemmOp, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``op`` on ``a`` ((batch,) m x k, or k x m when ``trans_a``) and ``b`` ((batch,) k x n or n x k)."""
    dt = compute_dtype(a.dtype, op.out_dtype)
    lhs = (a.transpose(-1, -2) if op.trans_a else a).to(dt)
    rhs = (b.transpose(-1, -2) if op.trans_b else b).to(dt)
    acc = torch.matmul(lhs, rhs)
    return _cast(apply_epilogue(acc, op.epilogue, bias, acc.dim() - 1), op.out_dtype)


#: PyTorch's own SDPA (what ``F.scaled_dot_product_attention`` is), immune to ``patch_attention``
_TORCH_SDPA = torch._C._nn.scaled_dot_product_attention
#: its ``enable_gqa`` (torch 2.5): grouped-query heads without expanded copies of K and V (2-core Zen 4 VM, bf16
#: GQA decode h32/8 x 4096 keys d128: the two ``repeat_interleave`` copies took as long as the attention itself)
_NATIVE_GQA = torch_version() >= (2, 5)


def _native_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether PyTorch's SDPA takes these grouped-query heads itself (``enable_gqa``: torch 2.5+, 4-D operands
    with the same batch dim); else K and V are expanded to q's heads."""
    return _NATIVE_GQA and q.shape[:-3] == k.shape[:-3] == v.shape[:-3] and q.dim() == 4


def attention(op: AttentionOp, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention, grouped-query heads through ``enable_gqa`` (torch 2.5+, same leading dims)
    or expanded to match ``q``; ``q``/``k``/``v``/``mask``
    as the user passed them to ``tracea.ops.attention`` (leading dimensions broadcast by PyTorch), the
    op's causal flag, scale and dropout. A causal flag together with a mask (Tracea allows both) becomes
    one mask."""
    group = op.heads // int(op.kv_heads or op.heads)
    # Packed copies of strided views: PyTorch's CPU SDPA returns wrong values (or NaN) for inputs whose
    # rows overlap in memory (as_strided windows), in every dtype (found by tracea.fuzzing).
    q, k, v = _dense(q), _dense(k), _dense(v)
    gqa: dict[str, bool] = {}
    if group > 1 and k.shape[-3] != q.shape[-3]:  # heads are dim -3 of (..., heads, seq, d)
        if _native_gqa(q, k, v):
            gqa = {"enable_gqa": True}  # (torch >= 2.5: no expanded copies of K and V)
        else:
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    causal = op.causal
    if mask is not None:
        mask = mask.contiguous()  # a broadcast (stride-0) mask stays small: SDPA broadcasts it itself
        if mask.data_ptr() % 16:
            mask = mask.clone()
        if mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        if causal:
            keep = torch.ones(op.seq_q, op.seq_kv, dtype=torch.bool, device=q.device).tril()
            mask = mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))
            causal = False
    if op.scale is not None and not op.scale > 0 and q.is_cuda:
        # PyTorch's fused CUDA kernels (flash / memory-efficient) return NaN for a zero or negative scale
        # (found by tracea.fuzzing, fp16 / bf16); its math backend on float32 copies computes it.
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415 - rare path

        if mask is not None and mask.dtype != torch.bool:
            mask = mask.float()
        with sdpa_kernel(SDPBackend.MATH):
            out = _TORCH_SDPA(q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=op.dropout_p,
                              is_causal=causal, scale=op.scale, **gqa)
        return _cast(out, op.out_dtype)
    out = _TORCH_SDPA(q, k, v, attn_mask=mask, dropout_p=op.dropout_p, is_causal=causal, scale=op.scale, **gqa)
    return _cast(out, op.out_dtype)


def _row_major(t: torch.Tensor) -> bool:
    """Whether ``t`` has the exact row-major strides (size-1 dims included) :func:`_dense` keeps."""
    step = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if stride != step:
            return False
        step *= max(size, 1)
    return True


def _apart(t: torch.Tensor) -> bool:
    """Whether no two elements of ``t`` share memory (its strides, sorted, each step over all the inner dims'
    span) and its last dim is unit-stride: the strided views models pass to SDPA (q, k, v unbound from one
    packed projection, heads transposed out of (B, S, H, D)), which PyTorch's CPU SDPA reads right; views
    whose rows overlap (``as_strided`` windows, broadcast stride-0 dims) it does not."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return False
    span = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def direct_attention(op: AttentionOp, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None) -> Callable[..., torch.Tensor] | None:
    """:func:`attention` for every call of one ``tracea.ops.attention`` signature no Tracea kernel serves,
    decided once on its first call's tensors (the signature fixes their shapes, strides, dtypes and devices):
    ``compute(q, k, v, mask)`` calling PyTorch's SDPA with nothing rebuilt per call, or None where
    :func:`attention` has to adapt the operands (overlapping views, on CUDA any strided one; expanded GQA heads, a
    causal flag merged into a mask, a mask of another dtype, a non-positive scale on CUDA). A call whose tensors start off
    16-byte alignment (a view into a buffer) takes :func:`attention`. Like the fallback hook, it records no
    autograd graph."""
    laid_out = _row_major if q.is_cuda else _apart  # (CUDA: packed only, see _dense)
    if not all(laid_out(t) for t in (q, k, v)) or op.dropout_p or q.dtype != torch_dtype(op.out_dtype):
        return None
    if mask is not None and (op.causal or not laid_out(mask) or mask.dtype not in (torch.bool, q.dtype)):
        return None
    if op.scale is not None and not op.scale > 0 and q.is_cuda:
        return None
    gqa: dict[str, bool] = {}  # (torch < 2.5 has no enable_gqa keyword)
    if op.heads // int(op.kv_heads or op.heads) > 1 and k.shape[-3] != q.shape[-3]:
        if not _native_gqa(q, k, v):
            return None
        gqa = {"enable_gqa": True}
    sdpa, causal, scale, grad, no_grad = _TORCH_SDPA, op.causal, op.scale, torch.is_grad_enabled, torch.no_grad

    def compute(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor, mm: torch.Tensor | None) -> torch.Tensor:
        if (qq.data_ptr() | kk.data_ptr() | vv.data_ptr() | (0 if mm is None else mm.data_ptr())) % 16:
            return attention(op, qq, kk, vv, mm)
        if grad() and (qq.requires_grad or kk.requires_grad or vv.requires_grad):
            with no_grad():
                return sdpa(qq, kk, vv, attn_mask=mm, is_causal=causal, scale=scale, **gqa)
        return sdpa(qq, kk, vv, attn_mask=mm, is_causal=causal, scale=scale, **gqa)

    return compute


def run_logical(op: Op, arrays: dict[str, Any]) -> torch.Tensor:
    """Compute ``op`` from tensors as a user passes them to ``tracea.ops``: conv2d arrays logically
    NCHW (any memory format), GEMM operands untransposed ((batch,) m x k and (batch,) k x n, any
    strides). The op's physical layout and transpose flags are ignored."""
    if isinstance(op, Conv2dOp):
        return conv2d(replace(op, layout=Layout.NCHW), arrays["x"], arrays["w"], arrays.get("bias"))
    if isinstance(op, GemmOp):
        return gemm(replace(op, trans_a=False, trans_b=False), arrays["a"], arrays["b"], arrays.get("bias"))
    if isinstance(op, AttentionOp):
        return attention(op, arrays["q"], arrays["k"], arrays["v"], arrays.get("mask"))
    raise TypeError(f"no PyTorch implementation for {type(op).__name__}")
