"""Decisions: which variant and config run an op on a device, and why every other variant did not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.device import Device
from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from .profile import DeviceProfile
from .variant import KernelVariant


class FrameworkFaster(str):
    """A rejection reason that is a speed judgement, not a limit: the framework's own kernel (cuDNN's grouped
    convolutions, say) was measured faster than the variant on shapes like this one. The variant can run the
    op. A caller that times its choice against the framework's call on the call's own arrays (first-use
    tuning's framework check, :func:`tracea.runtime.plan_ops.framework_judged`) asks the Doctor to keep such
    a variant as a candidate (``Doctor.decide(..., framework_check=True)``); everywhere else it rejects.

    Variants return it from their checks like any reason string: ``FrameworkFaster("... cuDNN measured
    faster from 4M multiply-adds")``."""

    __slots__ = ()


@dataclass
class Candidate:
    """An accepted variant with the config it would run and the evidence for its rank.

    ``source`` is ``"forced"`` (caller pinned the config), ``"cache"`` (tuned result), ``"hero"`` (a hero
    config) or ``"space"`` (first valid point of the search space). ``measured_s`` is the tuned median
    from the cache, when there is one. ``note`` says why a cache entry for this variant was ignored
    (see :mod:`tracea.doctor.cached_config`), empty otherwise.
    """

    variant: KernelVariant
    config: PipelineConfig
    source: str
    estimate_s: float
    measured_s: float | None = None
    note: str = ""
    #: how ``estimate_s`` was reached (:class:`tracea.perfmodel.Estimate`), None for a plain roofline
    estimate: Any = None
    #: the :class:`FrameworkFaster` reasons the variant gave, kept as a candidate only for a framework
    #: check (``Doctor.decide(..., framework_check=True)``): the framework serves unless timing says otherwise
    framework_faster: str = ""

    @property
    def rank_key(self) -> tuple[int, int, float, int]:
        # Oracles last; then cache evidence (measured time) before the variant's own estimate; priority
        # breaks ties.
        tier = 1 if self.variant.fallback_only else 0
        if self.measured_s is not None:
            return (tier, 0, self.measured_s, -self.variant.priority)
        return (tier, 1, self.estimate_s, -self.variant.priority)

    def to_dict(self) -> dict[str, Any]:
        out = {"variant": self.variant.name, "backend": self.variant.backend, "config": self.config.key,
               "source": self.source, "estimate_s": self.estimate_s, "measured_s": self.measured_s,
               "note": self.note}
        if self.framework_faster:
            out["framework_faster"] = self.framework_faster
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_dict()
        return out

    def estimate_text(self) -> str:
        """``estimate 0.123 ms`` with the model's method and the roofline it started from."""
        e = self.estimate
        if e is None:
            return f"estimate {self.estimate_s * 1e3:.4g} ms (roofline)"
        if e.method == "roofline":
            return f"estimate {self.estimate_s * 1e3:.4g} ms (roofline: {e.detail})"
        return f"estimate {self.estimate_s * 1e3:.4g} ms ({e.method}: {e.detail}; roofline {e.roofline_s * 1e3:.4g} ms)"


@dataclass
class Rejection:
    """A variant that cannot serve the op, with every reason."""

    variant: str
    backend: str
    reasons: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "backend": self.backend, "reasons": list(self.reasons)}


@dataclass
class Decision:
    """The Doctor's verdict for one op on one device. ``chosen`` is ``candidates[0]``."""

    op: Op
    device: Device
    profile: DeviceProfile
    candidates: list[Candidate]
    rejected: list[Rejection] = field(default_factory=list)
    #: variants of this op kind that serve other device kinds (not candidates here)
    elsewhere: list[str] = field(default_factory=list)
    #: one line on the performance model that ranked untuned candidates ('' when none was used)
    model: str = ""

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    @property
    def variant(self) -> KernelVariant:
        return self.chosen.variant

    @property
    def config(self) -> PipelineConfig:
        return self.chosen.config

    def explain(self) -> str:
        """Human-readable account: the choice, the ranked alternatives and every rejection."""
        c = self.chosen
        lines = [f"{self.op.describe()} on {self.device} ({self.profile.name})",
                 f"  chosen: {c.variant.name} [{c.source}] config {c.config.key}"]
        why = (f"tuned median {c.measured_s * 1e3:.3f} ms" if c.measured_s is not None
               else c.estimate_text())
        lines.append(f"    because: {why}; ranked first of {len(self.candidates)} accepted")
        if c.note:
            lines.append(f"    note: {c.note}")
        if c.framework_faster:
            lines.append(f"    kept (forced, or for the framework check) despite: {c.framework_faster}")
        for other in self.candidates[1:]:
            t = (f"tuned {other.measured_s * 1e3:.3f} ms" if other.measured_s is not None
                 else other.estimate_text())
            lines.append(f"  also accepted: {other.variant.name} ({t})" + (f"; note: {other.note}" if other.note else ""))
        for r in self.rejected:
            lines.append(f"  rejected: {r.variant}: {'; '.join(r.reasons)}")
        if self.model:
            lines.append(f"  ranking: {self.model}")
        if self.elsewhere:
            lines.append(f"  for other devices: {', '.join(self.elsewhere)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op.to_dict(), "op_key": self.op.key, "device": str(self.device),
                "chosen": self.chosen.to_dict(), "candidates": [c.to_dict() for c in self.candidates],
                "rejected": [r.to_dict() for r in self.rejected], "elsewhere": list(self.elsewhere),
                "model": self.model}
