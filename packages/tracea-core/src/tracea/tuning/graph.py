"""Graph tuning (seed: ``ctx.optimize_graph(graph, iterations=15, goal=...)``).

1. Identical nodes (same ``op.key``) are tuned once; their count multiplies their share.
2. Each distinct op's share of the graph's time is estimated (the fastest candidate variant's
   ``estimate_seconds`` times its count) and ops are tuned largest share first.
3. ``iterations`` is the graph's total budget of measured trials (per candidate variant): every
   distinct op gets at least one (its best-known config is verified), the rest is spread in proportion
   to the shares (largest remainder). Ops already tuned in this environment cost nothing.
4. Before tuning an op, the best configs of the most similar already-tuned ops of the same kind and
   variant (this run first, then the cache; similarity is the distance between log2 dimensions) are
   enqueued as starting points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from .autotuner import AutoTuner, TuneResult
from .cache import TuningCache
from .goals import OptimizationGoal

#: similar shapes whose configs seed a new op's search.
SIMILAR_SEEDS = 2


@dataclass
class GraphNodeReport:
    """One distinct op of the graph: the node indices sharing it, its estimated share of the graph's
    time, the trial budget it got, the ops whose configs seeded it, and the tuning result."""

    op: Op
    nodes: list[int]
    share: float
    budget: int
    seeded_from: list[str] = field(default_factory=list)
    result: TuneResult | None = None


@dataclass
class GraphTuneReport:
    """What :func:`optimize_graph` did, node by node, in tuning order."""

    goal: OptimizationGoal
    iterations: int
    entries: list[GraphNodeReport]
    elapsed_s: float = 0.0

    @property
    def measured_trials(self) -> int:
        return sum(e.result.measured_trials for e in self.entries if e.result is not None)

    @property
    def total_time_s(self) -> float:
        """Sum over all nodes of the tuned median time (inf if any node has no valid config)."""
        return sum((e.result.median_s if e.result and e.result.ok else math.inf) * len(e.nodes)
                   for e in self.entries)

    def config_for(self, node_index: int) -> PipelineConfig | None:
        for e in self.entries:
            if node_index in e.nodes:
                return e.result.config if e.result else None
        raise IndexError(node_index)

    def table(self) -> str:
        rows = [("nodes", "op", "share", "budget", "trials", "variant", "best", "config")]
        for e in self.entries:
            r = e.result
            best = f"{r.median_s * 1e6:.1f} us" if r and r.ok else "failed"
            trials = "cache" if r and r.from_cache else str(r.measured_trials if r else 0)
            rows.append((",".join(map(str, e.nodes)), e.op.describe(), f"{e.share:.0%}", str(e.budget), trials,
                         (r.variant or "-") if r else "-", best, r.config.key if r and r.config else "-"))
        from ..cli.table import aligned

        return "\n".join(aligned(rows))

    def to_json(self) -> dict[str, Any]:
        return {"goal": self.goal.value, "iterations": self.iterations, "elapsed_s": self.elapsed_s,
                "nodes": [{"nodes": e.nodes, "op": e.op.key, "share": e.share, "budget": e.budget,
                           "seeded_from": e.seeded_from, "result": e.result.to_json() if e.result else None}
                          for e in self.entries]}


def graph_ops(graph: Any) -> list[Op]:
    """The ops of ``graph``: a :class:`tracea.Graph` (``.nodes``), or any iterable of ops or of nodes
    carrying an ``.op``."""
    nodes = getattr(graph, "nodes", graph)
    out = []
    for n in nodes:
        out.append(n if isinstance(n, Op) else n.op)
    return out


def split_budget(shares: Sequence[float], iterations: int) -> list[int]:
    """At least one trial each; the rest in proportion to ``shares`` by largest remainder."""
    n = len(shares)
    rest = max(0, iterations - n)
    total = sum(shares) or 1.0
    quotas = [rest * s / total for s in shares]
    budget = [1 + int(q) for q in quotas]
    left = iterations - sum(budget)
    for i in sorted(range(n), key=lambda i: -(quotas[i] - int(quotas[i])))[:max(0, left)]:
        budget[i] += 1
    return budget


def _dims(op: Op) -> dict[str, float]:
    d = op.to_dict() if hasattr(op, "to_dict") else {}
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _same_family(a: Op, b: Op) -> bool:
    return a.kind is b.kind and a.dtypes == b.dtypes and a.out_dtype == b.out_dtype


def shape_distance(a: Op, b: Op) -> float:
    """Euclidean distance between the log2 of the numeric fields of two ops (inf across families)."""
    if not _same_family(a, b):
        return math.inf
    da, db = _dims(a), _dims(b)
    keys = set(da) | set(db)
    return math.sqrt(sum((math.log2(max(da.get(k, 1.0), 1e-9)) - math.log2(max(db.get(k, 1.0), 1e-9))) ** 2
                         for k in keys))


def optimize_graph(graph: Any, *, iterations: int = 15,
                   goal: OptimizationGoal | str = OptimizationGoal.MaximizeTFLOPS, device: Any = None,
                   doctor: Any = None, progress: bool = True, cache: TuningCache | bool | None = None,
                   seed: int | None = None, tuner: AutoTuner | None = None) -> GraphTuneReport:
    """Tune every distinct op of ``graph`` within ``iterations`` total trials (see the module docstring)."""
    import time

    start = time.monotonic()
    goal_ = OptimizationGoal.parse(goal)
    tuner = tuner or AutoTuner(None, goal=goal_, trials=max(1, iterations), seed=seed, cache=cache,
                               progress=progress, doctor=doctor)
    ops = graph_ops(graph)
    groups: dict[str, GraphNodeReport] = {}
    for i, op in enumerate(ops):
        g = groups.get(op.key)
        if g is None:
            groups[op.key] = GraphNodeReport(op, [i], 0.0, 0)
        else:
            g.nodes.append(i)
    entries = list(groups.values())
    estimates = [_estimate(tuner, e.op, device) * len(e.nodes) for e in entries]
    total = sum(estimates) or 1.0
    for e, est in zip(entries, estimates):
        e.share = est / total
    entries.sort(key=lambda e: -e.share)
    for e, b in zip(entries, split_budget([e.share for e in entries], iterations)):
        e.budget = b
    done: list[GraphNodeReport] = []
    for e in entries:
        seeds, sources = _similar_seeds(tuner, e.op, done)
        e.seeded_from = sources
        e.result = tuner.tune(e.op, device, goal=goal_, trials=e.budget, seeds=seeds)
        done.append(e)
    return GraphTuneReport(goal_, iterations, entries, time.monotonic() - start)


def _estimate(tuner: AutoTuner, op: Op, device: Any) -> float:
    try:
        pairs = tuner.candidates(op, device)
    except Exception:  # noqa: BLE001 - an op nothing serves still gets a share (it will fail visibly)
        return float(op.flops) * 1e-12
    ests = []
    for v, prof in pairs:
        try:
            ests.append(float(v.estimate_seconds(op, prof)))
        except Exception:  # noqa: BLE001
            continue
    return min(ests) if ests else float(op.flops) * 1e-12


def _usable_entry(tuner: AutoTuner, entry: Any, op: Op) -> bool:
    """Whether a cache entry's config passes the cached-config rule for the op it was tuned for (a
    damaged or hand-edited entry must not reach a kernel as a seed)."""
    try:
        variant = tuner.doctor.registry.get(entry.variant)
        if variant is None:
            return False
        profile = tuner.profile_for(entry.device or None)
        return tuner.cache_entry_problem(entry, op, variant, profile) is None
    except Exception:  # noqa: BLE001 - an unknown device or a broken hook: not a seed
        return False


def _similar_seeds(tuner: AutoTuner, op: Op,
                   done: Iterable[GraphNodeReport]) -> tuple[dict[str, list[PipelineConfig]], list[str]]:
    """Best configs per variant of the nearest already-tuned ops (this run, then the cache)."""
    found: list[tuple[float, str, str, PipelineConfig, Any]] = []
    for d in done:
        if d.result is None:
            continue
        dist = shape_distance(op, d.op)
        for name, vr in d.result.variants.items():
            if vr.config is not None and math.isfinite(dist):
                found.append((dist, d.op.key, name, vr.config, None))
    cache = tuner.cache
    if cache is not None:
        from ..ir.ops import op_from_dict

        for entry in cache.entries():
            if entry.op_key == op.key or not entry.op:
                continue
            try:
                other = op_from_dict(dict(entry.op))
            except Exception:  # noqa: BLE001 - an entry from another Tracea version
                continue
            dist = shape_distance(op, other)
            if math.isfinite(dist):
                found.append((dist, entry.op_key, entry.variant, entry.config, (entry, other)))
    found.sort(key=lambda t: t[0])
    seeds: dict[str, list[PipelineConfig]] = {}
    sources: list[str] = []
    for _, key, variant, config, cached in found:
        lst = seeds.setdefault(variant, [])
        if len(lst) < SIMILAR_SEEDS and all(c.key != config.key for c in lst):
            if cached is not None and not _usable_entry(tuner, *cached):
                continue
            lst.append(config)
            if key not in sources:
                sources.append(key)
    return seeds, sources
