"""Runtime dispatch: op + arrays -> Doctor decision -> prepared kernel -> launch.

:func:`execute` is what :mod:`tracea.ops` calls after validating arguments. When every variant rejects
an op (or no backend serves the arrays' device), the ``tracea_fallback_run`` hook lets a framework
integration compute it instead; that is counted in :mod:`tracea.runtime.fallbacks`.
"""

from __future__ import annotations

from typing import Any

from ..doctor.decision import Decision
from ..doctor.doctor import Doctor, get_doctor
from ..doctor.profile import DeviceProfile
from ..doctor.variant import KernelVariant, OpArgs
from ..errors import BackendError, NoVariantError, TraceaError, UnsupportedDeviceError
from ..ir.device import Device
from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from . import fallbacks


# (variant, op, config, device) already prepared in this process: the prepare hook runs once per key.
_prepared: set[tuple[Any, ...]] = set()


def prepare_and_run(variant: KernelVariant, op: Op, config: PipelineConfig, args: OpArgs,
                    profile: DeviceProfile, doctor: Doctor | None = None) -> None:
    """Prepare (compile, cached by the backend) then run ``variant`` through the plugin hooks.

    Exceptions that are not :class:`~tracea.errors.TraceaError` are wrapped in
    :class:`~tracea.errors.BackendError` naming the variant, so callers see one hierarchy.
    """
    hook = (doctor or get_doctor()).pm.hook
    key = (variant.name, op, config, profile.device)
    try:
        if key not in _prepared:
            hook.tracea_prepare_variant(variant=variant, op=op, config=config, profile=profile)
            if len(_prepared) > 4096:
                _prepared.clear()
            _prepared.add(key)
        hook.tracea_run_variant(variant=variant, op=op, config=config, args=args, profile=profile)
    except TraceaError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise BackendError(f"variant {variant.name} failed on {op.describe()} with config {config.key}: "
                           f"{type(exc).__name__}: {exc}", backend=variant.backend) from exc


def run_decision(decision: Decision, args: OpArgs, doctor: Doctor | None = None) -> None:
    """Run the chosen candidate of ``decision`` on ``args``."""
    c = decision.chosen
    prepare_and_run(c.variant, decision.op, c.config, args, decision.profile, doctor)


def fallback_reason(exc: TraceaError) -> str:
    """A short, stable reason for the fallback counters."""
    if isinstance(exc, NoVariantError):
        reasons = sorted({r for name, rs in exc.rejections.items() if not name.startswith("reference.") for r in rs})
        if not reasons:
            reasons = sorted({r for rs in exc.rejections.values() for r in rs})
        return "; ".join(reasons[:3]) or "no variant"
    return str(exc).split("\n")[0]


def execute(op: Op, arrays: dict[str, Any], out: Any, adapter: Any, device: Device, *,
            variant: str | None = None, config: PipelineConfig | None = None,
            doctor: Doctor | None = None, user_arrays: dict[str, Any] | None = None) -> Any:
    """Decide and run ``op`` on ``arrays`` (packed, by role), writing ``out``; returns ``out``.

    Falls back through ``tracea_fallback_run`` only when nothing serves the op and the caller did not
    force a variant or config. ``user_arrays`` (the arrays as the user passed them, before packing)
    are what the fallback hook receives; default ``arrays``.
    """
    doctor = doctor or get_doctor()
    free = variant is None and config is None
    try:
        decision = doctor.decide(op, device, variant=variant, config=config)
    except (NoVariantError, UnsupportedDeviceError) as exc:
        result = _fallback(doctor, op, user_arrays or arrays, out, fallback_reason(exc)) if free else None
        if result is not None:
            return result
        raise
    if free and decision.variant.fallback_only and not adapter.allows_fallback_only():
        rejected = {r.variant: r.reasons for r in decision.rejected}
        reason = (fallback_reason(NoVariantError("", rejected)) if rejected
                  else f"no {op.kind.value} kernel for {device.kind} installed") + " (only the reference oracle)"
        result = _fallback(doctor, op, user_arrays or arrays, out, reason)
        if result is not None:
            return result
    run_decision(decision, OpArgs(arrays, out, adapter), doctor)
    return out


def _fallback(doctor: Doctor, op: Op, arrays: dict[str, Any], out: Any, reason: str) -> Any:
    try:
        result = doctor.pm.hook.tracea_fallback_run(op=op, arrays=arrays, out=out, reason=reason)
    except TraceaError:
        raise
    except Exception as exc:  # noqa: BLE001 - the framework's own error, in Tracea's hierarchy
        raise BackendError(f"the framework fallback for {op.describe()} failed ({reason}): "
                           f"{type(exc).__name__}: {exc}", backend="fallback") from exc
    if result is not None:
        fallbacks.record(op.kind.value, reason)
    return result
