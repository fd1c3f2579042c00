"""What tracea-torch decides for a call before any plan exists: activation names, the op's float32 mode,
the output memory format, and whether a Tracea variant (and which) may serve it."""

from __future__ import annotations

import torch

from tracea.doctor.decision import Decision
from tracea.doctor.doctor import get_doctor
from tracea.dtypes import DType, Fp32Precision
from tracea.errors import NoVariantError, UnsupportedDeviceError
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Op
from tracea.runtime.dispatch import fallback_reason

from .adapter import device_of
from .policy import reference_allowed
from .torch_flags import cudnn_allow_tf32, matmul_precision

ACTIVATION_NAMES = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_erf": "gelu_erf",
                    "gelu_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
SERVED_DTYPES = (DType.F64, DType.F32, DType.F16, DType.BF16)


class Fallback(Exception):
    """Internal: PyTorch must compute this call signature; ``args[0]`` is the reason."""


def parse_activation(activation: str | None) -> str | None:
    """Normalise an activation name: None/'none', 'relu', 'gelu' (erf, PyTorch's default), 'gelu_tanh',
    'silu'."""
    key = "none" if activation is None else str(activation).strip().lower()
    if key not in ACTIVATION_NAMES:
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("activation", activation, "one of " + ", ".join(sorted(ACTIVATION_NAMES)))
    return ACTIVATION_NAMES[key]


def epilogue_for(has_bias: bool, activation: str | None) -> Epilogue:
    steps = (["bias"] if has_bias else []) + ([activation] if activation else [])
    return Epilogue.of(*steps)


def fp32_precision(device_type: str, conv: bool) -> Fp32Precision:
    """torch's float32 math mode for this call: cuDNN's ``allow_tf32`` for CUDA convolutions (on by
    default), ``torch.get_float32_matmul_precision()`` otherwise."""
    if conv and device_type == "cuda":
        return Fp32Precision.HIGH if cudnn_allow_tf32() else Fp32Precision.HIGHEST
    return Fp32Precision.parse(matmul_precision())


def output_memory_format(x: torch.Tensor) -> torch.memory_format:
    """Memory format of a conv output: channels_last exactly when the input is channels_last and not
    also plainly contiguous (the fake kernel uses the same rule)."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def choose(op: Op, device: torch.device) -> Decision:
    """The Doctor's decision for ``op`` here; raise :class:`Fallback` unless a variant tracea-torch may
    use serves it (the reference oracle only where the policy allows). With the arbiter on, a variant that
    declined only because PyTorch's kernel measured faster on such shapes
    (:class:`~tracea.doctor.decision.FrameworkFaster`) stays a candidate: the arbiter times it against
    PyTorch on the layer's own call before it serves (``Candidate.framework_faster``)."""
    if device.type not in ("cpu", "cuda"):
        raise Fallback(f"device {device.type} not served by Tracea")
    from . import arbiter

    try:
        decision = get_doctor().decide(op, device_of(device), framework_check=arbiter.enabled())
    except (NoVariantError, UnsupportedDeviceError) as exc:
        raise Fallback(fallback_reason(exc)) from None
    if decision.chosen.variant.backend != "reference":
        return decision
    if not reference_allowed():
        rejected = {r.variant: r.reasons for r in decision.rejected if r.backend != "reference"}
        if not rejected:
            raise Fallback(f"no {op.kind.value} kernel for {device.type} installed (only the reference oracle)")
        raise Fallback(fallback_reason(NoVariantError("", rejected)))
    if any(dt.numpy is None for dt in op.dtypes):
        raise Fallback(f"reference backend cannot view {op.dtypes[0].value} host tensors (needs ml_dtypes)")
    return decision


def serving_variant(op: Op, device: torch.device) -> tuple[str, str] | None:
    """``(variant name, config source)`` that runs ``op`` for tracea-torch, or None when PyTorch would."""
    try:
        chosen = choose(op, device).chosen
    except Fallback:
        return None
    return chosen.variant.name, chosen.source
