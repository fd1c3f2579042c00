"""The environment fingerprint that makes a tuned config valid.

A tuning result is reused only where it was measured: same device model and architecture (compute
capability, ISA flags, core count), same driver and runtime (CUDA, NVRTC, OpenCL), same compiler and
toolkit facts a backend reports through ``tracea_environment``, same backend and Tracea versions and,
when the variant offers one, the same kernel source hash. Change any of these and the cache misses.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

from .._version import __version__
from ..doctor.profile import DeviceProfile
from ..ir.ops import Op


def plugin_manager(doctor: Any = None) -> Any:
    """The plugin manager the doctor uses, else the process-wide one."""
    for attr in ("plugin_manager", "pm"):
        pm = getattr(doctor, attr, None) if doctor is not None else None
        if pm is not None:
            return pm() if callable(pm) and not hasattr(pm, "hook") else pm
    from ..plugins.manager import get_plugin_manager

    return get_plugin_manager()


def _short_hash(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def device_fingerprint(profile: DeviceProfile) -> str:
    """Hash of the device profile's own fingerprint fields (no plugin facts)."""
    return _short_hash(profile.fingerprint_fields())


def backend_version(pm: Any, backend: str) -> str:
    """The version the ``tracea_backend_info`` hook reports for ``backend`` ('' if none does)."""
    try:
        results = pm.hook.tracea_backend_info()
    except Exception:  # noqa: BLE001 - a broken plugin must not break fingerprinting
        return ""
    for r in results:
        for info in (r if isinstance(r, (list, tuple)) else [r]):
            if getattr(info, "name", None) == backend:
                return str(getattr(info, "version", ""))
    return ""


def environment_facts(pm: Any, profile: DeviceProfile) -> dict[str, str]:
    """Merged ``tracea_environment`` results for ``profile`` (earlier plugins' keys win)."""
    merged: dict[str, str] = {}
    try:
        results = pm.hook.tracea_environment(profile=profile)
    except Exception as exc:  # noqa: BLE001
        return {"environment_error": f"{type(exc).__name__}: {exc}"}
    for r in results or []:
        for k, v in (r or {}).items():
            merged.setdefault(str(k), str(v))
    return merged


def source_hash(variant: Any, op: Op) -> str:
    """``variant.source_hash`` (a string, or a callable taking ``op`` or nothing), or ''."""
    sh = getattr(variant, "source_hash", None)
    if sh is None:
        return ""
    if not callable(sh):
        return str(sh)
    try:
        params = inspect.signature(sh).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    return str(sh(op) if len(params) >= 1 else sh())


def fingerprint_fields(variant: Any, op: Op, profile: DeviceProfile, pm: Any) -> dict[str, Any]:
    """Every fact the fingerprint of ``variant`` on ``profile`` (for ``op``) covers."""
    fields: dict[str, Any] = dict(profile.fingerprint_fields())
    fields["env"] = environment_facts(pm, profile)
    backend = getattr(variant, "backend", "")
    fields["backend_version"] = backend_version(pm, backend)
    fields["tracea"] = __version__
    src = source_hash(variant, op)
    if src:
        fields["source"] = src
    return fields


def fingerprint(fields: dict[str, Any]) -> str:
    """Short stable hash of :func:`fingerprint_fields`."""
    return _short_hash(fields)


def uses_op(variant: Any) -> bool:
    """Whether the variant's fingerprint depends on the op (it has an op-dependent source hash)."""
    sh = getattr(variant, "source_hash", None)
    if sh is None or not callable(sh):
        return False
    try:
        return len(inspect.signature(sh).parameters) >= 1
    except (TypeError, ValueError):
        return True
