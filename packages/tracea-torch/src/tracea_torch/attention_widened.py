"""16-bit attention on the CPU through Tracea's float32 kernel: q, k, v (and an additive mask) widened to
float32, ``tracea.ops.attention`` on the copies, the output rounded once to the input dtype.

Used where no CPU attention kernel reads 16-bit operands itself (Arm, float16 on AVX2; AVX-512 and AVX2
CPUs have ``cpu.attention.<isa>`` for bf16, AVX-512 for fp16 too, which the normal plan serves). The CPU
attention kernels were float32 only, so a float16 / bfloat16 SDPA call there fell back to PyTorch,
whose 16-bit CPU SDPA is slower than its float32 one on the machines measured. 2-core Zen 4 VM (AVX512_BF16),
torch 2.13, per call: PyTorch bf16 / fp32 SDPA 519 / 465 us (b2 h3 197x64, DeiT-tiny), 1031 / 931 us (b2 h6
197x64), 9093 / 6982 us (b1 h12 577x64); Tracea's fp32 kernel on widened copies 365 / 704 / 5722 us. The
widening and the rounding are exact / round-to-nearest-even (a bf16 is the top half of an fp32), so the
result is at least as accurate as PyTorch's. Like every Tracea choice for a patched SDPA it serves only on the
arbiter's verdict (timed against PyTorch's 16-bit call on the first call's tensors, outputs compared); the
verdict is kept under the 16-bit op, not the float32 one the kernel runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from tracea.dtypes import DType
from tracea.errors import TraceaError
from tracea.runtime.plans import Uncacheable

WIDENED = (torch.float16, torch.bfloat16)


def applies(q: torch.Tensor) -> bool:
    """Whether ``q``'s call may take the widened path: a float16 / bfloat16 tensor on the CPU."""
    return q.device.type == "cpu" and q.dtype in WIDENED


def build(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None, is_causal: bool,
          scale: float | None, enable_gqa: bool) -> tuple[Callable[..., torch.Tensor], Any] | None:
    """``(run, decision)``: ``run(q, k, v, mask)`` computing the call through Tracea's float32 kernel, and the
    Doctor's decision for it restated for the 16-bit op (what the arbiter judges and caches); None when no
    Tracea kernel serves the widened call either (the caller keeps PyTorch's SDPA)."""
    from .bridge_attention import core_plan  # (it imports this module)

    dt = q.dtype

    def widen(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype == dt else t  # (a bool mask stays as it is)

    qf, kf, vf, mf = widen(q), widen(k), widen(v), None if m is None else widen(m)
    try:
        core = core_plan(qf, kf, vf, mf, is_causal, scale, enable_gqa)  # (the fp32 plan, built and stored)
    except (TraceaError, Uncacheable):
        return None
    run = getattr(core, "runner", None)
    if core is None or run is None or run.launch is None or run.decision is None:
        return None
    storage = DType.BF16 if dt is torch.bfloat16 else DType.F16
    decision = replace(run.decision, op=replace(run.decision.op, dtype=storage, dtype_out=storage))

    def widened(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor, mm: torch.Tensor | None) -> torch.Tensor:
        return core(widen(qq), widen(kk), widen(vv), None if mm is None else widen(mm), None).to(dt)  # type: ignore[misc]

    widened.op = decision.op  # type: ignore[attr-defined]
    return widened, decision
