"""The tuner's correctness check: a candidate's output against the float64 reference.

For a big op the full float64 reference costs tens of seconds on the host (an 8192^3 GEMM is 1.1
TFLOP), so the reference is computed on a *sample* of the op's independent slices instead: GEMM rows
(always including the first and last, where edge tiles live) of at most two batches, conv2d images
(always including the last), attention batches. The candidate's whole output is still scanned for
NaN/inf, so a config that leaves elements unwritten (outputs are poisoned with NaN) fails anyway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, Op

#: ops above this many FLOPs are checked on a sample costing about this much.
SAMPLE_FLOPS = 2e9
#: pause after computing the reference so BLAS worker threads stop spinning before timing starts.
SETTLE_S = 0.2


@dataclass
class ReferenceCheck:
    """Expected values of a slice of the output, and how to take the same slice of a candidate's output.

    :param expected: the float64-accumulated reference of the sampled slice.
    :param take: maps a full output (host array) to the sampled slice.
    :param sampled: fraction of the output the reference covers (1.0: the whole output).
    """

    expected: np.ndarray
    take: Callable[[np.ndarray], np.ndarray]
    sampled: float = 1.0

    @classmethod
    def full(cls, expected: np.ndarray) -> "ReferenceCheck":
        return cls(expected, lambda out: out, 1.0)

    def error(self, out: np.ndarray) -> float:
        """||out - ref|| / ||ref|| over the sample; inf when any element of ``out`` is NaN/inf."""
        from .inputs import relative_error

        out = np.asarray(out)
        if out.dtype.kind == "f" and not np.isfinite(out).all():
            return float("inf")
        return relative_error(self.take(out), self.expected)


def _sorted_pick(rng: np.random.Generator, n: int, count: int, keep: tuple[int, ...]) -> np.ndarray:
    count = max(min(count, n), len(set(keep)))
    chosen = set(k % n for k in keep)
    rest = np.setdiff1d(np.arange(n), np.fromiter(chosen, dtype=np.int64))
    extra = rng.choice(rest, size=min(len(rest), count - len(chosen)), replace=False) if len(rest) else []  # type: ignore[var-annotated]
    return np.sort(np.concatenate([np.fromiter(chosen, dtype=np.int64), np.asarray(extra, dtype=np.int64)]))


def sample_plan(op: Op, host: dict[str, np.ndarray | None], rng: np.random.Generator,
                budget_flops: float = SAMPLE_FLOPS) -> tuple[Op, dict[str, np.ndarray | None],
                                                              Callable[[np.ndarray], np.ndarray], float] | None:
    """``(sub_op, sub_inputs, take, fraction)`` for a sampled check of ``op``, or None to check it whole."""
    if op.flops <= budget_flops:
        return None
    if isinstance(op, GemmOp):
        nb = min(op.batch, 2)
        batches = _sorted_pick(rng, op.batch, nb, (op.batch - 1,))
        rows = _sorted_pick(rng, op.m, int(budget_flops // (2 * nb * op.n * op.k)) or 1, (0, op.m - 1))
        lead = op.batch > 1

        def pick_a(a: np.ndarray) -> np.ndarray:
            a = a[batches] if lead else a
            return a[..., :, rows] if op.trans_a else a[..., rows, :]

        sub = {**host, "a": np.ascontiguousarray(pick_a(host["a"])),  # type: ignore[arg-type]
               "b": np.ascontiguousarray(host["b"][batches] if lead else host["b"])}  # type: ignore[index]
        sub_op = replace(op, m=len(rows), batch=len(batches))

        def take(out: np.ndarray) -> np.ndarray:
            out = out.reshape((op.batch, op.m, op.n))[batches][:, rows, :]
            return out if lead else out[0]

        return sub_op, sub, take, len(batches) * len(rows) / (op.batch * op.m)
    if isinstance(op, Conv2dOp):
        per_image = op.flops / op.n
        images = _sorted_pick(rng, op.n, int(budget_flops // per_image) or 1, (op.n - 1,))
        sub = {**host, "x": np.ascontiguousarray(host["x"][images])}  # type: ignore[index]
        return replace(op, n=len(images)), sub, (lambda out: out[images]), len(images) / op.n
    if isinstance(op, AttentionOp):
        per_batch = op.flops / op.batch
        batches = _sorted_pick(rng, op.batch, int(budget_flops // per_batch) or 1, (op.batch - 1,))
        sub = {r: (None if a is None else np.ascontiguousarray(a[batches])) for r, a in host.items()}
        return replace(op, batch=len(batches)), sub, (lambda out: out[batches]), len(batches) / op.batch
    return None


def reference_check(op: Op, host: dict[str, np.ndarray | None], run_reference: Callable[[Op, dict], np.ndarray],
                    seed: int = 0, budget_flops: float = SAMPLE_FLOPS) -> ReferenceCheck:
    """The check for input set ``host``: the whole reference for small ops, a sample for big ones.

    :param run_reference: computes the reference output of an op on host inputs.
    """
    plan = sample_plan(op, host, np.random.default_rng(seed), budget_flops)
    if plan is None:
        check = ReferenceCheck.full(run_reference(op, host))
    else:
        sub_op, sub, take, fraction = plan
        check = ReferenceCheck(run_reference(sub_op, sub), take, fraction)
    # The reference ran on NumPy's BLAS, whose worker threads busy-wait for ~0.1 s afterwards; on a
    # 2-core machine the first candidate timed in that window ran ~1.5x slower (measured).
    time.sleep(SETTLE_S)
    return check


def as_check(reference: Any) -> ReferenceCheck | None:
    """Accepts a :class:`ReferenceCheck`, a full expected array, or None."""
    if reference is None or isinstance(reference, ReferenceCheck):
        return reference
    return ReferenceCheck.full(np.asarray(reference))
