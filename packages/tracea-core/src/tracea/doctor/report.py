"""The Doctor's report as plain data (``tracea doctor --json`` prints it; the text view renders it)."""

from __future__ import annotations

import platform
import sys
from typing import Any, Sequence

from .._version import __version__
from ..errors import NoVariantError, TraceaError
from ..ir.device import Device
from ..ir.ops import Op
from ..runtime import fallbacks, plans
from .doctor import Doctor
from .recommend import recommendations


def build_report(doctor: Doctor, ops: Sequence[Op] = (), device: Device | str | None = None) -> dict[str, Any]:
    """Everything the Doctor knows, plus a decision (or the rejection reasons) for each op in ``ops``."""
    pm = doctor.pm
    report: dict[str, Any] = {
        "tracea_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "devices": [p.to_dict() for p in doctor.profiles()],
        "best_device": str(doctor.best_device()),
        "backends": [{"name": b.name, "version": b.version, "package": b.package, "available": b.available,
                      "reason": b.reason, "details": dict(b.details)} for b in doctor.backends()],
        "version_mismatches": doctor.version_mismatches(),
        "plugins": [{"name": name, "source": pm.sources.get(name, "?")}
                    for name, _ in pm.list_name_plugin() if name is not None and not name.startswith("_")],
        "plugin_errors": dict(pm.load_errors),
        "registry_errors": list(doctor.registry_errors),
        "variants": [{"name": v.name, "backend": v.backend, "op": v.op_kind.value, "device_kind": v.device_kind,
                      "description": v.description} for v in doctor.variants()],
        "fallbacks": [{"op": k, "reason": r, "count": n} for (k, r), n in sorted(fallbacks.counts().items())],
        "verdicts": _verdicts(),
        "recommendations": [r.to_dict() for r in recommendations(doctor)],
        "plans": plans.stats(),
        "decisions": [],
    }
    target = Device.parse(device) if device is not None else None
    for op in ops:
        dev = target or doctor.best_device()
        entry: dict[str, Any] = {"op": op.to_dict(), "describe": op.describe(), "device": str(dev)}
        try:
            entry.update(doctor.decide(op, dev).to_dict())
            entry["ok"] = True
        except NoVariantError as exc:
            entry.update(ok=False, error=str(exc).split("\n")[0],
                         rejected=[{"variant": n, "reasons": r} for n, r in exc.rejections.items()])
        except TraceaError as exc:
            entry.update(ok=False, error=str(exc), rejected=[])
        report["decisions"].append(entry)
    return report


def _verdicts() -> list[dict[str, Any]]:
    """The framework arbiter's persisted verdicts (tuning-cache entries of ``*.arbiter`` pseudo-variants):
    which side serves each layer signature, with both times."""
    try:
        from ..tuning.cache import get_cache

        entries = [e for e in get_cache().entries() if e.variant.endswith(".arbiter")]
    except Exception:  # noqa: BLE001 - no tuner or no readable cache: nothing to show
        return []
    out = []
    for e in entries:
        p = dict(e.config.params)
        out.append({"op": e.op_key, "device": e.device, "arbiter": e.variant, "winner": p.get("winner"),
                    "tracea_variant": p.get("variant"), "tracea_s": p.get("tracea_s"), "framework_s": p.get("torch_s"),
                    "note": p.get("note", "")})
    return out
