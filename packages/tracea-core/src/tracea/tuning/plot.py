"""Convergence plot: best time so far against measured trial, one line per variant, saved as PNG.
matplotlib is optional (``pip install tracea-core[plot]``)."""

from __future__ import annotations

import math
import os
from typing import Any

from ..errors import TraceaError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TraceaError("the convergence plot needs matplotlib: pip install matplotlib "
                          "(or pip install 'tracea-core[plot]')") from exc
    return plt


def plot_convergence(result: Any, path: str | os.PathLike[str]) -> str:
    """Save best-time-vs-trial of a :class:`~tracea.tuning.autotuner.TuneResult` to ``path`` (PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    by_variant: dict[str, list[Any]] = {}
    for t in result.history:
        if t.status != "invalid":
            by_variant.setdefault(t.variant, []).append(t)
    for name, trials in by_variant.items():
        best, xs, ys, fx, fy = math.inf, [], [], [], []
        for i, t in enumerate(trials, 1):
            if t.ok:
                fx.append(i)
                fy.append(t.score_s * 1e6)
                best = min(best, t.score_s)
            if math.isfinite(best):
                xs.append(i)
                ys.append(best * 1e6)
        line = ax.step(xs, ys, where="post", label=f"{name} (best so far)")[0]
        ax.scatter(fx, fy, s=10, alpha=0.4, color=line.get_color())
    ax.set_xlabel("measured trial")
    ax.set_ylabel(f"time, {result.goal.label} (us)")
    ax.set_yscale("log")
    ax.set_title(f"{result.op.describe()} on {result.device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out
