"""Which calls PyTorch computed instead of a Tracea variant, and why.

The counters live in core (``tracea.runtime.fallbacks``, shown by ``tracea doctor`` under "Framework
fallbacks"): dispatch records the fallbacks it makes, and tracea-torch records those it decides itself
(an input layout no kernel reads, only the reference oracle accepting the op). This module re-exports
them with a convenience :func:`total`.

``TRACEA_WARN_FALLBACK=1`` emits one :class:`FallbackWarning` per distinct (op, reason).
"""

from __future__ import annotations

from tracea.runtime.fallbacks import FallbackWarning, counts, record, reset

ENV_WARN = "TRACEA_WARN_FALLBACK"


def total(kind: str | None = None, contains: str = "") -> int:
    """How many fallbacks of op ``kind`` (any when None) whose reason contains ``contains``."""
    return sum(n for (k, r), n in counts().items() if (kind is None or k == kind) and contains in r)


def report() -> str:
    """The counters as a small table, then the arbiter's verdicts of this process and the model check's
    (:mod:`tracea_torch.model_check`; empty string when nothing fell back and nothing was judged)."""
    from .arbiter import verdicts
    from .model_check import verdicts as model_verdicts

    rows = sorted(counts().items(), key=lambda kv: (-kv[1], kv[0]))
    lines = []
    if rows:
        from tracea.cli.table import aligned

        lines += aligned([(k, f"{n:>6}", r) for (k, r), n in rows])
    judged = verdicts()
    if judged:
        lines.append("arbiter verdicts (tracea vs PyTorch, device time per call):")
        for v in judged:
            times = (f"{v.tracea_s * 1e6:.1f} us vs {v.torch_s * 1e6:.1f} us" if v.tracea_s == v.tracea_s
                     else v.note)
            captured = f"; in CUDA graphs {v.captured_winner}" if v.captured_winner != v.winner else ""
            lines.append(f"  {v.winner:<6} {v.op} on {v.device} ({v.variant}; {times}; {v.source}{captured})")
    models = model_verdicts()
    if models:
        lines.append("model check verdicts (patched vs unpatched, median time a call):")
        for m in models:
            lines.append(f"  {m.winner:<6} {m.model} ({m.signature}): {m.patched_s * 1e3:.3f} ms vs "
                         f"{m.eager_s * 1e3:.3f} ms")
    return "\n".join(lines)


__all__ = ["ENV_WARN", "FallbackWarning", "counts", "record", "report", "reset", "total"]
