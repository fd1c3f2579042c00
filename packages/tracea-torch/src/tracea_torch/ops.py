"""``tracea_torch.ops.conv2d`` / ``linear`` / ``scaled_dot_product_attention``: Tracea kernels as PyTorch
custom ops.

Registered with ``torch.library.custom_op`` as ``tracea::conv2d``, ``tracea::linear`` and ``tracea::sdpa``
with a fake
(meta) kernel, so ``torch.compile(fullgraph=True)`` treats them as single opaque nodes, and with an
autograd formula, so training works:

* conv2d backward is ``aten.convolution_backward`` (PyTorch's own kernels);
* linear backward is two matmuls and a sum;
* sdpa backward is PyTorch's: the forward recomputed by ``F.scaled_dot_product_attention`` under
  autograd and differentiated (Tracea has no attention backward kernel);
* a fused activation is differentiated with ATen's own activation backward (``threshold_backward``
  on the saved output for ReLU; GELU/SiLU recompute the pre-activation in backward instead of
  storing it, trading one extra conv/GEMM for activation memory).

Under ``torch.autocast`` the wrappers cast floating inputs to the autocast dtype first, as autocast
does for ``F.conv2d``/``F.linear``. In plain eager inference (nothing requires grad, no tracing,
compiling, subclass or mode) the wrappers call the kernel directly instead of through the op: same
result, about 50 us less host time per call.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from tracea.runtime.plans import generation

from . import bridge, bridge_attention
from .adapter import causal_bias_mask
from .compat import check_torch_version
from .guards import NO_TENSOR, guard_of
from .fallbacks import record as _record

check_torch_version()

_GELU_APPROX = {"gelu_erf": "none", "gelu_tanh": "tanh"}


def _conv_out_shape(x: Tensor, w: Tensor, stride: Sequence[int], padding: Sequence[int],
                    dilation: Sequence[int]) -> list[int]:
    n, _, h, wd = x.shape
    p = (h + 2 * padding[0] - dilation[0] * (w.shape[2] - 1) - 1) // stride[0] + 1
    q = (wd + 2 * padding[1] - dilation[1] * (w.shape[3] - 1) - 1) // stride[1] + 1
    return [n, w.shape[0], p, q]


# ------------------------------------------------------------------------------------------------
# tracea::conv2d
# ------------------------------------------------------------------------------------------------

@torch.library.custom_op("tracea::conv2d", mutates_args=())
def _conv2d_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], groups: int, activation: str) -> Tensor:
    return bridge.conv2d(x, weight, bias, stride, padding, dilation, groups, activation)


@_conv2d_op.register_fake
def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups, activation):  # type: ignore[no-untyped-def]
    shape = _conv_out_shape(x, weight, stride, padding, dilation)
    return x.new_empty(shape).contiguous(memory_format=bridge.output_memory_format(x))


def _conv2d_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    x, weight, bias, stride, padding, dilation, groups, activation = inputs
    ctx.conf = (list(stride), list(padding), list(dilation), groups, bridge.parse_activation(activation))
    ctx.has_bias = bias is not None
    ctx.bias_len = weight.shape[0]
    ctx.save_for_backward(x, weight, bias, output)


def _activation_grad(grad: Tensor, act: Optional[str], output: Tensor, pre: "callable") -> Tensor:  # type: ignore[valid-type]
    if act is None:
        return grad
    if act == "relu":
        return torch.ops.aten.threshold_backward(grad, output, 0)
    z = pre()  # type: ignore[misc]
    if act == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    return torch.ops.aten.gelu_backward(grad, z, approximate=_GELU_APPROX[act])


def _conv2d_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, weight, bias, output = ctx.saved_tensors
    stride, padding, dilation, groups, act = ctx.conf
    gz = _activation_grad(grad, act, output, lambda: F.conv2d(x, weight, bias, stride, padding, dilation, groups))
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    gx, gw, gb = torch.ops.aten.convolution_backward(
        gz, x, weight, [ctx.bias_len] if ctx.has_bias else None, stride, padding, dilation, False, [0, 0],
        groups, mask)
    return gx, gw, (gb if ctx.has_bias else None), None, None, None, None, None


_conv2d_op.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


# ------------------------------------------------------------------------------------------------
# tracea::linear
# ------------------------------------------------------------------------------------------------

@torch.library.custom_op("tracea::linear", mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tensor:
    return bridge.linear(x, weight, bias, activation)


@_linear_op.register_fake
def _linear_fake(x, weight, bias, activation):  # type: ignore[no-untyped-def]
    return x.new_empty([*x.shape[:-1], weight.shape[0]])


def _linear_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    x, weight, bias, activation = inputs
    ctx.act = bridge.parse_activation(activation)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, bias, output)


def _linear_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, weight, bias, output = ctx.saved_tensors
    gz = _activation_grad(grad, ctx.act, output, lambda: F.linear(x, weight, bias))
    gz2 = gz.reshape(-1, gz.shape[-1])
    gx = gz @ weight if ctx.needs_input_grad[0] else None
    gw = gz2.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
    gb = gz2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb, None


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


# ------------------------------------------------------------------------------------------------
# Public wrappers (argument normalisation happens here, where torch.compile can trace it)
# ------------------------------------------------------------------------------------------------

def _private(name: str, default):  # type: ignore[no-untyped-def]
    return getattr(torch._C, name, default)


_dispatch_modes = _private("_len_torch_dispatch_stack", lambda: 1)
_function_modes = _private("_is_torch_function_mode_enabled", lambda: True)
_tracing_state = _private("_get_tracing_state", lambda: True)
_transforms_active = getattr(getattr(torch._C, "_functorch", None), "_are_functorch_transforms_active", None) or \
    _private("_are_functorch_transforms_active", lambda: True)
_is_compiling = torch.compiler.is_compiling
#: True only while dynamo traces (it folds the call to True); in eager a one-line function, where
#: ``is_compiling`` also asks TorchScript (two cold frames: ~0.9 us a call inside a model forward). The
#: memos' hit paths use it: under ``torch.export``'s non-strict tracing, which only ``is_compiling``
#: reports, their tensor guards see fake tensors and miss, and their lean paths call the functional op.
_is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", None) or _is_compiling
_grad_enabled = torch.is_grad_enabled
_any_autocast = _private("_is_any_autocast_enabled", lambda: True)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """True when the custom op's machinery has nothing to do for this call, so the kernel can be called
    directly (saves ~50 us of dispatcher and autograd-wrapper time per call): eager mode (not compiling,
    not jit-tracing, no torch function or dispatch mode, no functorch transform), plain tensors (no
    subclass) and no gradient to record. Anything else goes through ``torch.ops.tracea.*``."""
    if _is_compiling() or _tracing_state() is not None or _dispatch_modes() or _function_modes() \
            or _transforms_active():
        return False
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        return False
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    return True


def _pair(value: int | Sequence[int], arg: str) -> list[int]:
    if type(value) is tuple and len(value) == 2:  # what nn.Conv2d holds: the common case, no copy
        return value  # type: ignore[return-value]
    if isinstance(value, int):
        return [value, value]
    out = [int(v) for v in value]
    if len(out) == 1:
        return out * 2
    if len(out) != 2:
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError(arg, value, "an int or a pair of ints")
    return out


_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")  # device types torch.autocast knows (not meta)


def _autocast(*tensors: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    """Cast floating inputs to the autocast dtype where autocast is on for their device (callers test
    ``_any_autocast()`` first: ~0.1 us, and the common case costs no device or dtype queries)."""
    ref = next(t for t in tensors if t is not None)
    dev = ref.device.type
    if dev not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def _same_padding(x: Tensor, weight: Tensor, dilation: list[int]) -> tuple[Tensor, list[int]]:
    """padding='same' (stride 1): symmetric padding, plus one extra row/column at the end for an odd
    total, exactly as PyTorch pads."""
    pads, extra = [], []
    for d, k in zip(dilation, weight.shape[2:]):
        total = d * (k - 1)
        pads.append(total // 2)
        extra.append(total - 2 * (total // 2))
    if any(extra):
        x = F.pad(x, [0, extra[1], 0, extra[0]])
    return x, pads


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
           activation: Optional[str] = None) -> Tensor:
    """``F.conv2d`` computed by Tracea (plus an optional fused ``activation``: ``"relu"``, ``"gelu"``
    (erf), ``"gelu_tanh"``, ``"silu"``). Accepts batched (N, C, H, W) or unbatched (C, H, W) input and
    ``padding`` as int, pair, ``"valid"`` or ``"same"``. Differentiable; traceable by torch.compile."""
    stride_, dilation_ = _pair(stride, "stride"), _pair(dilation, "dilation")
    if _any_autocast():
        x, weight, bias = _autocast(x, weight, bias)  # type: ignore[assignment]
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    if isinstance(padding, str):
        if padding == "valid":
            pad = [0, 0]
        elif padding == "same":
            if tuple(stride_) != (1, 1):  # nn.Conv2d holds a tuple, _pair may give a list
                from tracea.errors import InvalidArgumentError

                raise InvalidArgumentError("padding", padding, "'same' only with stride 1 (as in PyTorch)")
            x, pad = _same_padding(x, weight, dilation_)
        else:
            from tracea.errors import InvalidArgumentError

            raise InvalidArgumentError("padding", padding, "an int, a pair, 'valid' or 'same'")
    else:
        pad = _pair(padding, "padding")
    act = activation or "none"
    if _direct(x, weight, bias):
        out = bridge.conv2d(x, weight, bias, stride_, pad, dilation_, int(groups), act)
    else:
        out = torch.ops.tracea.conv2d(x, weight, bias, list(stride_), list(pad), list(dilation_), int(groups), act)
    return out.squeeze(0) if unbatched else out


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """``F.linear`` computed by Tracea as one GEMM with the bias (and ``activation``) fused into its
    epilogue. Differentiable; traceable by torch.compile."""
    if _any_autocast():
        x, weight, bias = _autocast(x, weight, bias)  # type: ignore[assignment]
    if _direct(x, weight, bias):
        return bridge.linear(x, weight, bias, activation or "none")
    return torch.ops.tracea.linear(x, weight, bias, activation or "none")


# ------------------------------------------------------------------------------------------------
# tracea::sdpa
# ------------------------------------------------------------------------------------------------

def _sdpa_out_shape(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> list[int]:
    lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    heads = k.shape[-3] if (q.shape[-3] == 1 and not enable_gqa) else q.shape[-3]
    return [*lead, heads, q.shape[-2], v.shape[-1]]


@torch.library.custom_op("tracea::sdpa", mutates_args=())
def _sdpa_op(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool, scale: Optional[float],
             enable_gqa: bool) -> Tensor:
    out = bridge_attention.sdpa(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)
    # a custom op may not return an input or a view of one (PyTorch's SDPA can, for some shapes)
    return out.clone() if any(out is t or out._base is t for t in (q, k, v)) else out


@_sdpa_op.register_fake
def _sdpa_fake(q, k, v, attn_mask, is_causal, scale, enable_gqa):  # type: ignore[no-untyped-def]
    return q.new_empty(_sdpa_out_shape(q, k, v, enable_gqa))


def _sdpa_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    q, k, v, attn_mask, is_causal, scale, enable_gqa = inputs
    ctx.conf = (is_causal, scale, enable_gqa)
    ctx.save_for_backward(q, k, v, attn_mask)


def _sdpa_backward(ctx, grad):  # type: ignore[no-untyped-def]
    """PyTorch's SDPA backward: the forward recomputed by PyTorch under autograd, differentiated."""
    q, k, v, attn_mask = ctx.saved_tensors
    is_causal, scale, enable_gqa = ctx.conf
    want = list(ctx.needs_input_grad[:4])
    leaves = [t.detach().requires_grad_(w) if t is not None and t.is_floating_point() else t
              for t, w in zip((q, k, v, attn_mask), want)]
    with torch.enable_grad():
        out = bridge_attention.TORCH_SDPA(*leaves, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)
        wrt = [t for t, w in zip(leaves, want) if w and t is not None]
        grads = iter(torch.autograd.grad(out, wrt, grad, allow_unused=True) if wrt else ())
    return tuple(next(grads) if w and t is not None else None for t, w in zip(leaves, want)) + (None, None, None)


_sdpa_op.register_autograd(_sdpa_backward, setup_context=_sdpa_setup)


def _direct_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor]) -> bool:
    """:func:`_direct` for SDPA's four tensors."""
    if not _direct(q, k, v):
        return False
    return attn_mask is None or (type(attn_mask) in _PLAIN and not (_grad_enabled() and attn_mask.requires_grad))


#: the patched SDPA's last call: (tensor guard, (is_causal, scale, enable_gqa), some tensor requires grad,
#: plan generation, plan, and the plan's ``lean`` and ``count`` as on a patched layer's memo: PyTorch serves
#: the signature, so a hit calls PyTorch's SDPA itself, counting ``(kind, reason)`` per call when not None).
#: Transformer layers mostly share one attention signature, so one entry serves a
#: whole model; another signature replaces it (its lookup is the full path's, ~1-2 us more).
_SDPA_MEMO: list[Any] = [None]
_TORCH_SDPA = bridge_attention.TORCH_SDPA


def _causal_bias_args(attn_mask: Tensor, query: Tensor, key: Tensor, is_causal: bool
                      ) -> tuple[Optional[Tensor], bool]:
    """``(attn_mask, is_causal)`` with a ``CausalBias`` replaced (see :func:`scaled_dot_product_attention`);
    one made for other lengths than the call's stays a mask (the shape checks then say so)."""
    found = causal_bias_mask(attn_mask, query)
    if found is None:
        return attn_mask, is_causal
    align, sq, sk, mask = found
    if (align == "upper_left" or sq == sk) and (sq, sk) == (query.shape[-2], key.shape[-2]):
        return None, True
    return mask, is_causal


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention`` computed by Tracea (same arguments and result). Differentiable
    (the backward is PyTorch's, recomputing the forward); traceable by torch.compile. ``dropout_p`` > 0
    is computed by PyTorch (no Tracea kernel applies dropout) and counted as a fallback.

    A call with the tensor signatures, flags and plan generation of the previous eager call runs that
    call's plan directly (compared by one guard call, as a patched layer's memo does; see
    :mod:`tracea_torch.layer_path`). A ``torch.nn.attention.bias.CausalBias`` mask
    (``causal_upper_left`` / ``causal_lower_right``) is read for what it stands for: upper-left is
    ``is_causal``, lower-right the boolean mask it describes (its own ``__torch_function__`` only
    recognises the unpatched function)."""
    if attn_mask is not None and type(attn_mask) is not Tensor:  # (a subclass: maybe a CausalBias)
        attn_mask, is_causal = _causal_bias_args(attn_mask, query, key, is_causal)
    memo = _SDPA_MEMO[0]
    if (memo is not None and not dropout_p and memo[1] == (is_causal, scale, enable_gqa) and not _is_dynamo_compiling()
            and memo[0](query, key, value, NO_TENSOR if attn_mask is None else attn_mask) and memo[3] == generation()):
        if memo[5]:  # PyTorch serves the signature: call it as the unpatched function would
            if memo[6] is not None:
                _record(*memo[6])
            if scale is None and not enable_gqa:
                return _TORCH_SDPA(query, key, value, attn_mask, 0.0, is_causal)
            return _TORCH_SDPA(query, key, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)
        if not (_any_autocast() or _tracing_state() is not None or _dispatch_modes() or _function_modes()
                or _transforms_active() or (memo[2] and _grad_enabled())):
            return memo[4](query, key, value, attn_mask)
    if dropout_p:
        from . import fallbacks

        fallbacks.record("attention", f"dropout_p={dropout_p:g}: no Tracea kernel applies dropout")
        return bridge_attention.TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                           enable_gqa=enable_gqa)
    autocast = _any_autocast()
    if autocast:
        query, key, value, attn_mask = _autocast(query, key, value, attn_mask)  # type: ignore[assignment]
    if not _direct_sdpa(query, key, value, attn_mask):
        return torch.ops.tracea.sdpa(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa))
    gen = generation()  # before building: a plan built across an invalidation is looked up again
    plan, kept = bridge_attention.sdpa_plan_for(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
    if kept and not autocast and type(is_causal) is bool and (scale is None or type(scale) in (float, int)) \
            and type(enable_gqa) is bool:
        mask = NO_TENSOR if attn_mask is None else attn_mask
        rg = bool(query.requires_grad or key.requires_grad or value.requires_grad or mask.requires_grad)
        _SDPA_MEMO[0] = (guard_of(query, key, value, mask).check, (is_causal, scale, enable_gqa), rg, gen, plan,
                         getattr(plan, "lean", False), getattr(plan, "count", None))
    return plan(query, key, value, attn_mask)


__all__ = ["conv2d", "linear", "scaled_dot_product_attention"]
