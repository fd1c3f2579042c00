"""The ``torch.nn.functional.conv2d`` arguments that the conv kernels do not take directly: unbatched
(C, H, W) input and ``padding="valid"`` / ``"same"``.

The plan of such a call is a thin wrapper around the plan of a batched, symmetrically padded call
(``tracea.ops.conv2d`` itself, with its own plan-cache entry): a leading batch dimension of 1 is viewed
on the input and ``out`` (and dropped from the result), ``"valid"`` is padding 0, and ``"same"``
(stride 1 only, as in PyTorch) pads ``dilation * (kernel - 1)`` in total per dimension, half on each
side, the odd one at the end (bottom / right), as PyTorch does: an odd total is served by copying the
input into a zero-filled array one row / column larger at the end on every call.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import InvalidArgumentError, ShapeError
from ..ir.ops import Layout
from . import operands as ops_args, plans


def needs_adapting(x: Any, padding: Any) -> bool:
    """Whether a conv2d call needs this wrapper (unbatched input or string padding)."""
    return isinstance(padding, str) or len(getattr(x, "shape", ())) == 3


def conv2d(key: Any, x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: Any, layout: Any,
           out: Any, kwargs: dict[str, Any]) -> Any:
    """Build (and store under ``key``) the wrapper plan, and run it for this call."""
    from ..ops import conv2d as ops_conv2d

    xs, ws = tuple(getattr(x, "shape", ())), tuple(getattr(w, "shape", ()))
    if len(xs) not in (3, 4):
        raise ShapeError("x", x, "a 4-D (N, C, H, W) or unbatched 3-D (C, H, W) array")
    if len(ws) != 4:
        raise ShapeError("w", w, "a 4-D array (K, C/groups, R, S)")
    unbatched = len(xs) == 3
    nhwc = layout is not None and Layout.parse(layout) is Layout.NHWC
    r, s = (ws[1], ws[2]) if nhwc else (ws[2], ws[3])
    extra = (0, 0)
    pad: Any = padding
    if isinstance(padding, str):
        if padding == "valid":
            pad = 0
        elif padding == "same":
            if ops_args.pair("stride", stride) != (1, 1):
                raise InvalidArgumentError("padding", padding, "'same' only with stride 1 (as in PyTorch)")
            dil = ops_args.pair("dilation", dilation)
            totals = (dil[0] * (r - 1), dil[1] * (s - 1))
            pad = (totals[0] // 2, totals[1] // 2)
            extra = (totals[0] % 2, totals[1] % 2)
        else:
            raise InvalidArgumentError("padding", padding, "an int, a pair of ints, 'valid' or 'same'")

    def batched(t: Any) -> Any:
        if not unbatched:
            return t
        if not hasattr(t, "shape") or not hasattr(t, "__getitem__"):  # a list or scalar: say which argument
            raise InvalidArgumentError("out", type(t).__name__, "an array of the output's shape")
        return t[None]

    grow: Callable[[Any], Any] | None = None
    if any(extra):
        ext_h, ext_w = extra
        shape4 = (1,) + xs if unbatched else xs
        if nhwc:
            n_, h_, w_, c_ = shape4
            padded = (n_, h_ + ext_h, w_ + ext_w, c_)
        else:
            n_, c_, h_, w_ = shape4
            padded = (n_, c_, h_ + ext_h, w_ + ext_w)
        adapter = _adapter_of(x)
        dtype = adapter.info(x).dtype

        def grow(t: Any) -> Any:
            buf = adapter.empty(padded, dtype, t)
            buf[...] = 0
            if nhwc:
                buf[:, :h_, :w_, :] = t
            else:
                buf[:, :, :h_, :w_] = t
            return buf

    def plan(xx: Any, ww: Any, bb: Any, user_out: Any) -> Any:
        x4 = batched(xx)
        if grow is not None:
            x4 = grow(x4)
        res = ops_conv2d(x4, ww, bb, stride, pad, dilation, groups, layout=layout,
                         out=None if user_out is None else batched(user_out), **kwargs)
        if user_out is not None:
            return user_out
        return res[0] if unbatched else res

    if key is not None:
        plans.store(key, plan)
    return plan(x, w, b, out)


def _adapter_of(x: Any) -> Any:
    from ..doctor.doctor import get_doctor
    from .arrays import find_adapter

    return find_adapter(x, get_doctor().adapters(), "x")
