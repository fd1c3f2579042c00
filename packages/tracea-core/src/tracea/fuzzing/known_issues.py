"""Defects known and being fixed elsewhere, which the oracle can tolerate while they are.

The switch is OFF by default, so they show as findings; turn it on with ``--known-issues`` (or
``TRACEA_FUZZ_KNOWN_ISSUES=1``) to see only new findings. Tolerated mismatches are still counted, in
the report's ``known`` list and the table's ``known`` column. Remove an entry once its fix lands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

ENV = "TRACEA_FUZZ_KNOWN_ISSUES"


def enabled(flag: bool | None = None) -> bool:
    """Whether known issues are tolerated (``flag`` when given, else the environment)."""
    if flag is not None:
        return flag
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class KnownIssue:
    """``applies(ctx)`` says whether the issue can explain a case's mismatches; ``positions(ctx, bad)``
    narrows the mismatching positions it explains (the rest stay findings)."""

    key: str
    title: str
    applies: Callable[[dict[str, Any]], bool]
    positions: Callable[[dict[str, Any], np.ndarray], np.ndarray]


def _nonfinite_ref(ctx: dict[str, Any], bad: np.ndarray) -> np.ndarray:
    return bad & ~np.isfinite(ctx["ref"])


def _all(ctx: dict[str, Any], bad: np.ndarray) -> np.ndarray:
    return bad


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue("relu-nonfinite-cpu", "CPU gemm/conv: NaN/Inf does not propagate through a fused ReLU",
               lambda c: c["backend"] == "cpu" and c["op"] != "attention" and "relu" in c["steps"]
               and c["nonfinite_inputs"], _nonfinite_ref),
    KnownIssue("attention-nonfinite-cpu", "CPU attention: NaN/Inf inputs do not propagate like torch",
               lambda c: c["backend"] == "cpu" and c["op"] == "attention" and c["nonfinite_inputs"], _all),
    KnownIssue("bf16-bias-temporary", "CPU bf16 GEMM with bias reads a freed fp32 copy of the bias",
               lambda c: "cpu.gemm.avx512bf16" in c["variants"] and "bias" in c["steps"], _all),
)


def explain(ctx: dict[str, Any], bad: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``(still_bad, keys)``: the mismatches no known issue explains, and the issues that explained some."""
    keys = []
    for issue in KNOWN_ISSUES:
        if bad.any() and issue.applies(ctx):
            explained = issue.positions(ctx, bad)
            if explained.any():
                keys.append(issue.key)
                bad = bad & ~explained
    return bad, keys
