"""``TraceaConv2d`` and ``TraceaLinear``: drop-in ``nn.Conv2d`` / ``nn.Linear`` subclasses whose
forward runs Tracea kernels (through the ``tracea::conv2d`` / ``tracea::linear`` custom ops).

They take the same constructor arguments as their parents plus a keyword-only ``activation`` fused
into the kernel's epilogue, have the same parameters and ``state_dict`` keys (weights load from a
plain module and back), and convert from an existing module with ``from_conv`` / ``from_linear``
(sharing its parameters, no copy).
"""

from __future__ import annotations

from typing import Any, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from . import ops
from .bridge import parse_activation
from . import recording
from .bridge_plans import _ACT_FNS
from .model_check import _EAGER, _tls
from .bn_fold import _ACT as _BN_ACT, _BN, _CONV as _BN_CONV, _NEXT as _BN_NEXT, folded as _folded, pending as _pending
from .layer_path import _GEN, _KEY, _WRITES, _conv2d, _is_dynamo_compiling, _linear, conv2d_layer, layer_params, linear_layer


def conv2d_forward(module: nn.Conv2d, x: Tensor, activation: Optional[str] = None) -> Tensor:
    """What ``nn.Conv2d.forward`` computes, through Tracea; honours ``padding_mode`` and string padding."""
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        padding: Any = 0
    else:
        padding = module.padding
    return ops.conv2d(x, module.weight, module.bias, module.stride, padding, module.dilation, module.groups,
                      activation=activation)


def linear_forward(module: nn.Linear, x: Tensor, activation: Optional[str] = None) -> Tensor:
    """What ``nn.Linear.forward`` computes, through Tracea."""
    return ops.linear(x, module.weight, module.bias, activation=activation)


class TraceaConv2d(nn.Conv2d):
    """``nn.Conv2d`` computed by Tracea. Same constructor, plus ``activation`` (``None``, ``"relu"``,
    ``"gelu"``, ``"gelu_tanh"``, ``"silu"``) applied in the kernel epilogue after the bias."""

    #: fused activation (a class default so a module whose class was swapped in place has one).
    activation: Optional[str] = None

    def __init__(self, *args: Any, activation: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.activation = parse_activation(activation)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, activation: Optional[str] = None) -> "TraceaConv2d":
        """A TraceaConv2d with ``conv``'s hyper-parameters sharing its weight and bias tensors."""
        if not isinstance(conv, nn.Conv2d):
            from tracea.errors import InvalidArgumentError

            raise InvalidArgumentError("conv", type(conv).__name__, "an nn.Conv2d")
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                  dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode, device="meta", dtype=conv.weight.dtype, activation=activation)
        new.weight = conv.weight
        new.bias = conv.bias
        new.train(conv.training)
        return new

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - nn.Conv2d's parameter name
        if _EAGER[0] and _tls.eager:  # the model check routed this forward to PyTorch
            return self._torch_forward(input)
        bn = self.__dict__.get(_BN)
        if bn is not None and not _is_dynamo_compiling():  # a BatchNorm folded into this conv (bn_fold)
            d = self.__dict__
            nxt = d[_BN_NEXT]  # (an activation module after the BatchNorm, fused too, or None)
            # (links checked both ways: a shallow copy of the model, as nn.DataParallel's replicas are,
            # shares this dict with the original and would hand its output to the original's BatchNorm)
            linked = bn.__dict__.get(_BN_CONV) is self and (nxt is None or (
                nxt.__dict__.get(_BN_CONV) is self and not nxt._forward_pre_hooks and not nxt._forward_hooks))
            wb = _folded(self, bn, input) if linked else None
            hand = _pending()
            if wb is not None:
                out = conv2d_layer(self, input, wb[0], wb[1], d[_BN_ACT])
                hand[id(bn)] = out  # (the BatchNorm, and that module, pass exactly this tensor through)
                if nxt is not None:
                    hand[id(nxt)] = out
                return out
            hand.pop(id(bn), None)  # unfolded: they compute
            if nxt is not None:
                hand.pop(id(nxt), None)
        # A lean memo (a signature PyTorch serves, see layer_path.conv2d_layer) is matched here, one call
        # frame fewer than through conv2d_layer: the patched layer then costs no more than nn.Conv2d's own
        # forward (which calls _conv_forward), as TraceaLinear.forward measured
        memo = self.__dict__.get(_KEY)
        if memo is not None and memo.lean == 1 and self.activation is None and not _is_dynamo_compiling():
            ps: Any = self._parameters
            w = ps.get("weight")
            if (type(input) is Tensor and input.shape == memo.xshape and input.dtype is memo.xdtype and w is memo.w
                    and w.dtype is memo.wdtype and input.is_cuda is memo.xcuda and memo.gen == _GEN[0]
                    and memo.writes == _WRITES[0] and recording._recorder is None and self.padding_mode == "zeros"
                    and "bias" in ps):
                if memo.count is not None:
                    memo.count[0] += 1
                return _conv2d(input, w, ps["bias"], self.stride, self.padding, self.dilation, self.groups)
        if self.padding_mode != "zeros":
            return conv2d_forward(self, input, self.activation)
        w, b = layer_params(self)
        return conv2d_layer(self, input, w, b, self.activation)

    def _torch_forward(self, input: Tensor) -> Tensor:  # noqa: A002
        """What the unpatched layer computes (a folded BatchNorm and the activation after it compute
        themselves; an activation fused from an ``nn.Sequential`` is applied here)."""
        d = self.__dict__
        if d.get(_BN) is not None:
            hand = _pending()
            hand.pop(id(d[_BN]), None)
            if d.get(_BN_NEXT) is not None:
                hand.pop(id(d[_BN_NEXT]), None)
        if self.padding_mode != "zeros":  # (as nn.Conv2d._conv_forward, which a global patch replaces)
            out = F.conv2d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode), self.weight,
                           self.bias, self.stride, 0, self.dilation, self.groups)
        else:
            out = F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return out if self.activation is None else _ACT_FNS[self.activation](out)

    def extra_repr(self) -> str:
        act = f", activation={self.activation}" if self.activation else ""
        return super().extra_repr() + act


class TraceaLinear(nn.Linear):
    """``nn.Linear`` computed by Tracea as one GEMM with the bias (and ``activation``) fused."""

    activation: Optional[str] = None

    def __init__(self, *args: Any, activation: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.activation = parse_activation(activation)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: Optional[str] = None) -> "TraceaLinear":
        """A TraceaLinear with ``linear``'s shape sharing its weight and bias tensors."""
        if not isinstance(linear, nn.Linear):
            from tracea.errors import InvalidArgumentError

            raise InvalidArgumentError("linear", type(linear).__name__, "an nn.Linear")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  dtype=linear.weight.dtype, activation=activation)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if _EAGER[0] and _tls.eager:  # the model check routed this forward to PyTorch
            out = F.linear(input, self.weight, self.bias)  # (an activation module fused by act_fuse, not
            act = self.activation  # handed this output, computes itself)
            return out if act is None else _ACT_FNS[act](out)
        d = self.__dict__
        nxt = d.get(_BN_NEXT)
        if (nxt is not None and nxt.__dict__.get(_BN_CONV) is self and not nxt._forward_pre_hooks
                and not nxt._forward_hooks and not _is_dynamo_compiling()):  # an activation fused in (act_fuse)
            out = linear_layer(self, input, d[_BN_ACT])
            _pending()[id(nxt)] = out  # (it passes exactly this tensor through)
            return out
        # A lean memo (a signature PyTorch serves, see layer_path.linear_layer) is matched here, one call
        # frame fewer than through linear_layer. 2-core Sapphire Rapids VM, d512 decoder block, one-token
        # decode with its 7 linears served by PyTorch, interleaved single forwards: 0.98-0.995x eager through
        # linear_layer, 1.006-1.014x matched here
        memo = self.__dict__.get(_KEY)
        if memo is not None and memo.lean == 1 and self.activation is None and not _is_dynamo_compiling():
            ps: Any = self._parameters
            w = ps.get("weight")
            if (type(input) is Tensor and input.shape == memo.xshape and input.dtype is memo.xdtype and w is memo.w
                    and w.dtype is memo.wdtype and input.is_cuda is memo.xcuda and memo.gen == _GEN[0]
                    and memo.writes == _WRITES[0] and recording._recorder is None and "bias" in ps):
                if memo.count is not None:
                    memo.count[0] += 1
                return _linear(input, w, ps["bias"])
        return linear_layer(self, input, self.activation)

    def extra_repr(self) -> str:
        act = f", activation={self.activation}" if self.activation else ""
        return super().extra_repr() + act


__all__ = ["TraceaConv2d", "TraceaLinear", "conv2d_forward", "linear_forward"]
