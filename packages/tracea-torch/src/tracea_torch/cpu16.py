"""PyTorch's side of a float16 / bfloat16 convolution on the CPU: its own 16-bit call where that is right and
faster on this machine, else float32.

A 16-bit CPU conv that PyTorch serves (a fallback, an arbiter verdict, a depthwise layer) is computed by
default in float32 on NCHW copies and rounded once (:func:`tracea_torch.eager.conv2d`): PyTorch's 16-bit CPU
kernels ran 10-45x slower than its fp32 ones on CPUs without native 16-bit math (Zen 3: bf16 depthwise 24.7 vs
0.55 ms) and oneDNN returned wrong values for some shapes (a 1-channel 7x7 input, 5x5 kernel, stride (1, 3):
errors ~20 in bfloat16). On CPUs with AVX512_BF16 or AMX, though, ``F.conv2d`` in bfloat16 is the faster one
(Zen 4 VM, timm ``resnet26d`` b2 bf16: the layers PyTorch served ran 1.7-2.1x slower through fp32 than the
unpatched model's calls, and the patched model 0.91x eager). So on the first call of such a signature both
run on its arrays: PyTorch's 16-bit call serves when its output agrees with the fp32 one (the arbiter's
tolerance for the dtype, NaN and Inf in the same places) and it takes at most :data:`NATIVE_WIN` of the
fp32 path's time (the two sides in turn, as the arbiter times the CPU); otherwise float32 does.
"""

from __future__ import annotations

from typing import Callable

import torch

#: PyTorch's 16-bit call serves only when it took at most this share of the float32 path's time
NATIVE_WIN = 0.95


def torch_side(native: Callable[..., torch.Tensor] | None, fp32: Callable[..., torch.Tensor],
               args: tuple) -> tuple[Callable[..., torch.Tensor], str]:
    """``(compute, why)``: PyTorch's 16-bit call ``native(x, w, bias)`` or the float32 path ``fp32`` for the
    signature of ``args`` (the first call's tensors), by the rule in the module docstring. ``native`` None:
    ``fp32`` (an activation PyTorch's direct call cannot reproduce, say)."""
    from . import arbiter

    if native is None:
        return fp32, "float32 (no direct 16-bit call for this epilogue)"
    with torch.no_grad():
        try:
            ours, ref = native(*args), fp32(*args)
        except RuntimeError as exc:  # oneDNN refusing a 16-bit shape: float32 computes it
            return fp32, f"float32 (PyTorch's 16-bit call raised {type(exc).__name__})"
        err = arbiter._rel_err(ours, ref)
        tol = arbiter.TOLERANCE.get(ours.dtype, 5e-2)
        if not err <= tol:
            return fp32, f"float32 (PyTorch's 16-bit call differs: rel. error {err:.1e})"
        t_native, t_fp32 = arbiter._cpu_alternating(lambda: native(*args), lambda: fp32(*args))
    if t_native <= NATIVE_WIN * t_fp32:
        return native, f"PyTorch's 16-bit call ({t_native * 1e6:.0f} vs {t_fp32 * 1e6:.0f} us in float32)"
    return fp32, f"float32 ({t_fp32 * 1e6:.0f} vs {t_native * 1e6:.0f} us for PyTorch's 16-bit call)"
