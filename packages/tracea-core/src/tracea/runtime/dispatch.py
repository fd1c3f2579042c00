"""Runtime dispatch: op -> Doctor decision -> prepared, bound launcher (or a framework fallback).

:func:`runner` is what the plan builders (:mod:`tracea.runtime.plan_ops`, ``tracea_torch``) call once per
call signature; the :class:`Runner` it returns is what every later call with that signature runs. When
every variant rejects an op (or no backend serves the arrays' device), the ``tracea_fallback_run`` hook
lets a framework integration compute it instead; that is counted in :mod:`tracea.runtime.fallbacks`.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NoReturn

from ..doctor.decision import Decision
from ..doctor import recommend
from ..doctor.doctor import Doctor, get_doctor
from ..doctor.profile import DeviceProfile
from ..doctor.variant import KernelVariant, OpArgs, run_launcher
from ..errors import (BackendError, CaptureError, KernelFailureWarning, NoVariantError, TraceaError,
                      UnsupportedDeviceError)
from ..ir.device import Device
from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from . import attention_strides, fallbacks, first_use

Launcher = Callable[..., None]

# (variant, op, config, device) already prepared in this process: the prepare hook runs once per key.
_prepared: set[tuple[Any, ...]] = set()


def _wrap(exc: Exception, variant: KernelVariant, op: Op, config: PipelineConfig) -> BackendError:
    return BackendError(f"variant {variant.name} failed on {op.describe()} with config {config.key}: "
                        f"{type(exc).__name__}: {exc}", backend=variant.backend)


def prepare(variant: KernelVariant, op: Op, config: PipelineConfig, profile: DeviceProfile,
            doctor: Doctor | None = None) -> None:
    """Compile (cached by the backend) what running ``variant`` needs; once per key and process."""
    key = (variant.name, op, config, profile.device)
    if key in _prepared:
        return
    try:
        (doctor or get_doctor()).pm.hook.tracea_prepare_variant(variant=variant, op=op, config=config, profile=profile)
    except TraceaError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _wrap(exc, variant, op, config) from exc
    if len(_prepared) > 4096:
        _prepared.clear()
    _prepared.add(key)


def bind(variant: KernelVariant, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any,
         doctor: Doctor | None = None, *, quarantine_failures: bool = False) -> Launcher:
    """Prepare then bind ``variant``: a launcher ``launch(*inputs, out)`` (inputs in ``op.roles`` order)
    whose failures are :class:`~tracea.errors.BackendError` naming the variant. With
    ``quarantine_failures``, a run-time failure (not a :class:`CaptureError`) quarantines the variant for
    ``op`` and raises :class:`Quarantined` instead (the caller decides again)."""
    doctor = doctor or get_doctor()
    prepare(variant, op, config, profile, doctor)
    hook = doctor.pm.hook
    try:
        if any(impl.plugin_name != "delegate" for impl in hook.tracea_run_variant.get_hookimpls()):
            # a plugin intercepts runs: honour it on every call (no backend fast launcher)
            launch = run_launcher(hook.tracea_run_variant, variant, op, config, profile, adapter)
        else:
            launch = hook.tracea_bind_variant(variant=variant, op=op, config=config, profile=profile,
                                              adapter=adapter)
    except TraceaError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _wrap(exc, variant, op, config) from exc
    if getattr(op, "strides", None) is not None and not variant.takes_strides(op):
        launch = attention_strides.packing_launcher(launch, op, adapter)  # it reads packed arrays only

    def failed(exc: Exception) -> NoReturn:
        """Raise what a failure ``exc`` of the bound launch becomes (quarantining the variant for ``op``)."""
        if isinstance(exc, TraceaError):
            if quarantine_failures and isinstance(exc, BackendError) and not isinstance(exc, CaptureError):
                raise quarantine(variant, op, exc, doctor) from exc
            raise exc
        err = _wrap(exc, variant, op, config)  # one hierarchy for callers
        if quarantine_failures:
            raise quarantine(variant, op, err, doctor) from exc
        raise err from exc

    def guarded(*arrays: Any) -> None:
        try:
            launch(*arrays)
        except Exception as exc:  # noqa: BLE001
            failed(exc)

    # a plan's hot path may call ``raw`` itself and hand its exceptions to ``failed`` (one frame less)
    guarded.raw, guarded.failed = launch, failed  # type: ignore[attr-defined]
    guarded.pointer_only = getattr(launch, "pointer_only", False)  # type: ignore[attr-defined]
    return guarded


class Quarantined(TraceaError):
    """Internal signal: the variant a plan ran failed at run time and is quarantined for that op; the
    call is decided again (the next candidate runs)."""


def quarantine(variant: KernelVariant, op: Op, exc: BackendError, doctor: Doctor | None = None) -> Quarantined:
    """Quarantine ``variant`` for ``op`` after ``exc`` (warned once per variant and op kind) and return the
    :class:`Quarantined` signal to raise."""
    first = str(exc).splitlines()[0]
    key = (variant.name, op.kind)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"tracea: {variant.name} failed on {op.describe()} and is not used for it again in this "
                      f"process; the next candidate runs: {first}", KernelFailureWarning, stacklevel=4)
    (doctor or get_doctor()).quarantine(variant.name, op, first[:300])
    return Quarantined(first)


_warned: set[tuple[str, Any]] = set()


def prepare_and_run(variant: KernelVariant, op: Op, config: PipelineConfig, args: OpArgs,
                    profile: DeviceProfile, doctor: Doctor | None = None) -> None:
    """Prepare then run ``variant`` once through the plugin hooks (tests, tools; calls from ``tracea.ops``
    go through bound launchers). Foreign exceptions become :class:`BackendError`."""
    doctor = doctor or get_doctor()
    prepare(variant, op, config, profile, doctor)
    try:
        doctor.pm.hook.tracea_run_variant(variant=variant, op=op, config=config, args=args, profile=profile)
    except TraceaError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _wrap(exc, variant, op, config) from exc


def run_decision(decision: Decision, args: OpArgs, doctor: Doctor | None = None) -> None:
    """Run the chosen candidate of ``decision`` on ``args``."""
    c = decision.chosen
    prepare_and_run(c.variant, decision.op, c.config, args, decision.profile, doctor)


def fallback_reason(exc: TraceaError) -> str:
    """A short, stable reason for the fallback counters."""
    if isinstance(exc, NoVariantError):
        lists = [rs for name, rs in exc.rejections.items() if not name.startswith("reference.")]
        if not any(lists):
            lists = list(exc.rejections.values())
        seen: dict[str, int] = {}
        for rs in lists:
            for r in dict.fromkeys(rs):
                seen[r] = seen.get(r, 0) + 1
        # the reasons most variants share first (dropout, a mask kind), then alphabetically
        reasons = sorted(seen, key=lambda r: (-seen[r], r))
        return "; ".join(reasons[:3]) or "no variant"
    return str(exc).split("\n")[0]


class Runner:
    """What one call signature runs: a bound kernel (:attr:`launch`, ``launch(*inputs, out)``) or, when
    :attr:`launch` is None, a framework fallback for :attr:`reason` (run with :func:`fallback`)."""

    __slots__ = ("op", "decision", "launch", "reason")

    def __init__(self, op: Op, decision: Decision | None, launch: Launcher | None, reason: str | None) -> None:
        self.op, self.decision, self.launch, self.reason = op, decision, launch, reason

    @property
    def variant(self) -> str | None:
        """The variant that runs (None for a fallback)."""
        return None if self.decision is None or self.launch is None else self.decision.chosen.variant.name


def runner(op: Op, device: Device, adapter: Any, user_arrays: dict[str, Any], out: Any, *,
           variant: str | None = None, config: PipelineConfig | None = None,
           doctor: Doctor | None = None, inputs: tuple | None = None,
           framework_check: bool = False) -> tuple[Runner, Any]:
    """Decide ``op`` and build its :class:`Runner`, trying a fallback on the first call's arrays
    (``user_arrays`` by role as the user passed them, ``out`` the kernel output) where dispatch would.

    Returns ``(runner, first_result)``: the fallback's result of the first call when the runner is a
    fallback (the hook computes on a call's arrays, so finding out whether it serves them runs it), else
    None (the caller launches). A fallback happens only when no variant or config is forced, and:
    nothing serves the op, or only a fallback-only oracle does and the adapter prefers its framework.
    With the first-use tuning policy (:mod:`tracea.runtime.first_use`) and ``inputs`` (the call's packed
    inputs, ``out`` its kernel output), an untuned signature times its top candidates first.
    ``framework_check``: the caller times the choice against the framework's own call before using it
    (:func:`tracea.runtime.plan_ops.framework_judged`), so variants that declined only because the framework
    measured faster stay candidates (``Doctor.decide(..., framework_check=True)``); so do they for arrays no
    framework computes (``ArrayAdapter.framework_computes`` False: NumPy, CuPy).
    """
    doctor = doctor or get_doctor()
    free = variant is None and config is None
    # FrameworkFaster declines are judgements against a framework: arrays no framework computes keep those variants
    keep = framework_check or not getattr(adapter, "framework_computes", False)
    while True:
        try:
            decision = doctor.decide(op, device, variant=variant, config=config, framework_check=keep)
        except (NoVariantError, UnsupportedDeviceError) as exc:
            if free:
                reason = fallback_reason(exc)
                result = _fallback(doctor, op, user_arrays, out, reason)
                if result is not None:
                    return Runner(op, None, None, reason), result
            raise
        if free and decision.variant.fallback_only and not adapter.allows_fallback_only():
            rejected = {r.variant: r.reasons for r in decision.rejected}
            reason = (fallback_reason(NoVariantError("", rejected)) if rejected
                      else f"no {op.kind.value} kernel for {device.kind} installed") + " (only the reference oracle)"
            result = _fallback(doctor, op, user_arrays, out, reason)
            if result is not None:
                return Runner(op, decision, None, reason), result
        if inputs is not None and first_use.wants_tuning(decision, free):
            def bind_config(v: KernelVariant, cfg: PipelineConfig, d: Decision = decision) -> Launcher:
                return bind(v, d.op, cfg, d.profile, adapter, doctor)

            if first_use.tune(decision, inputs, out, adapter, bind_config):
                continue  # the tuned entry now ranks the winner
        c = decision.chosen
        if free and c.variant.fallback_only and c.variant.backend == "reference":
            recommend.warn_reference_only(doctor, op.kind.value, device.kind, c.variant.name)
        try:
            launch = bind(c.variant, decision.op, c.config, decision.profile, adapter, doctor,
                          quarantine_failures=free)
        except CaptureError:
            raise
        except BackendError as exc:  # it does not compile or load here: the next candidate, when free
            if not free:
                raise
            quarantine(c.variant, decision.op, exc, doctor)
            continue
        return Runner(op, decision, launch, None), None


def fallback(runner_: Runner, user_arrays: dict[str, Any], out: Any, doctor: Doctor | None = None) -> Any:
    """Run a fallback runner's framework computation for one call (counted). Returns its result."""
    doctor = doctor or get_doctor()
    result = _fallback(doctor, runner_.op, user_arrays, out, runner_.reason or "")
    if result is None:  # the plugin stopped serving these arrays (it was unloaded?)
        raise NoVariantError(f"no kernel variant can run {runner_.op.describe()} and no framework fallback "
                             f"took it ({runner_.reason})")
    return result


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
