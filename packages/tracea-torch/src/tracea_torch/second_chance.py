"""The arbiter's second chance: when PyTorch's kernel beats Tracea's first choice for a layer signature.

The Doctor's first choice on a shape nobody tuned is a ranked guess; the arbiter (:mod:`tracea_torch.arbiter`)
measures it against PyTorch on the signature's first call. When PyTorch's kernel wins on device time,
the next few candidates -- the configs and variants first-use tuning would time
(:func:`tracea.runtime.first_use.alternatives`, at most :data:`RETRIES`) -- are timed on the same call
against PyTorch, paired as the verdict was. The one with the best ratio, if clearly better than the first
choice's (:data:`MARGIN`, in its own time and relative to PyTorch's) and agreeing with PyTorch's result, is persisted as a tuned entry of the
tuning cache, so the Doctor chooses it from then on (here and in later processes), and the arbiter
judges it like any choice. Only losing signatures pay this (a few compilations on their first call);
``TRACEA_ARBITER=0`` turns it off with the arbiter.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from tracea.doctor.decision import Decision
from tracea.errors import TraceaError, TuningCacheWarning
from tracea.runtime import first_use

from . import arbiter

#: alternatives timed after a lost verdict
RETRIES = 3
#: a verdict is worth a second chance when Tracea's kernel time exceeds PyTorch's by this factor (closer
#: losses are not worth the first call's extra compilations: H100, a ViT-S/ResNeXt-50 first forward took
#: 0.4 / 9.5 s without second chances and 5.3 / 19.5 s with them on every lost signature)
LOST_BY = 1.05
#: an alternative replaces the first choice only when both its time and its time relative to PyTorch's
#: are at most this share of the first choice's (measurement noise must not flip a choice)
MARGIN = 0.97


def worth_retrying(verdict: arbiter.Verdict) -> bool:
    """Whether a verdict lost on kernel time by more than :data:`LOST_BY` (device time on CUDA, the
    alternating time on the CPU), was measured now (a cached verdict had its chance in the process that
    measured it) and not for a wrong result."""
    if verdict.source != "measured" or verdict.note.startswith("result differed"):
        return False
    if not (verdict.tracea_s == verdict.tracea_s and verdict.torch_s == verdict.torch_s):
        return False
    return verdict.tracea_s > LOST_BY * verdict.torch_s


def retry(decision: Decision, device: torch.device, verdict: arbiter.Verdict,
          build_run: Callable[[Any, Any], Callable[..., torch.Tensor]], run_torch: Callable[..., torch.Tensor],
          args: tuple) -> bool:
    """Time the alternatives to ``decision``'s choice (``build_run(variant, config)`` gives a run like the
    plan's, ``run_torch`` PyTorch's) on ``args``; persist the best if it beats the first choice's ratio
    to PyTorch (``verdict``) by :data:`MARGIN`. True when a tuned entry was written (decide again)."""
    first_ratio = verdict.tracea_s / max(verdict.torch_s, 1e-12)
    best: tuple[float, Any, Any, float] | None = None
    with torch.no_grad():
        ref = run_torch(*args)
        tol = arbiter.TOLERANCE.get(ref.dtype, 5e-2)
        for variant, cfg in first_use.alternatives(decision, RETRIES):
            try:
                run = build_run(variant, cfg)
                ours = run(*args)
            except TraceaError:
                continue  # it does not compile or run here: not a candidate
            if not arbiter._rel_err(ours, ref) <= tol:
                continue
            fa, fb = (arbiter.cold_weight_calls(run, run_torch, args) if device.type == "cuda"
                      else ((lambda run=run: run(*args)), (lambda: run_torch(*args))))
            try:
                t_ours, t_theirs = (arbiter._paired(fa, fb, arbiter._gpu_batch) if device.type == "cuda"
                                    else arbiter._cpu_alternating(fa, fb))
            except TraceaError:
                continue
            ratio = t_ours / max(t_theirs, 1e-12)
            if best is None or ratio < best[0]:
                best = (ratio, variant, cfg, t_ours)
    if best is None or best[0] > MARGIN * first_ratio or best[3] > MARGIN * verdict.tracea_s:
        return False  # (better both relative to PyTorch's time, which drifts, and in its own time)
    ratio, variant, cfg, t_ours = best
    written = first_use.persist(decision, variant, cfg, [t_ours])
    if not written:
        warnings.warn(f"tracea: {decision.op.describe()}: {variant.name} {cfg.key} ran {first_ratio / ratio:.2f}x "
                      "faster than the first choice, but no tuning cache took it", TuningCacheWarning, stacklevel=3)
    return written


__all__ = ["LOST_BY", "MARGIN", "RETRIES", "retry", "worth_retrying"]
