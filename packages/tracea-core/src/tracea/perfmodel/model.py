"""The performance model: a variant's untuned time on an op, from measured neighbours.

For each (variant, op group) the model keeps the measured times of the variant's default config on
other shapes of this architecture, as residuals against the variant's own roofline estimate
(``KernelVariant.estimate_seconds``, times the GPU wave quantization of the config):
``r = ln(measured / roofline)``, the roofline of the device the time was measured on (a data file's recorded
profile: H100 data on an H200 keep their efficiency, not their seconds). An op's estimate is its roofline times ``exp(r̂)`` where ``r̂`` is

1. **knn**: the Gaussian-weighted mean residual of the nearest measured shapes within
   :data:`RADIUS` (log2 units: "a factor of 2.8 in one dimension"), shrunk towards the local
   calibration (2.) when the neighbours are few or far; else
2. **calibrated**: the median residual of the variant's measured shapes within :data:`CALIBRATION_RADIUS`
   (a factor of 8 in one dimension), shrunk towards 0 by their count: the variant's measured efficiency
   in this region replaces the hand-set constant; else
3. **roofline**: 0 -- no data for this variant, op group or architecture near the op: the roofline
   estimate as is. (A variant-wide calibration would extrapolate: a scalar CPU kernel measured only on
   small shapes looks efficient relative to its roofline everywhere.)

Plain NumPy, a few thousand points at most; an estimate costs tens of microseconds and the Doctor
memoises decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .data import Observation
from .features import group_key, roofline_times, shape_vector, wave_factor

#: neighbours farther than this (in log2-shape units) are not "near"
RADIUS = 1.5
#: Gaussian kernel width of the neighbour weights
BANDWIDTH = 0.6
#: at most this many neighbours average
K_NEAREST = 8
#: pseudo-weight of the calibrated residual in the neighbour average (one neighbour at distance 0 weighs 1)
PRIOR_WEIGHT = 0.15
#: measured shapes within this distance calibrate the variant's efficiency (tier 2, and knn's shrink target)
CALIBRATION_RADIUS = 3.0
#: pseudo-count shrinking the calibrated median residual towards the roofline
CALIBRATION_SHRINK = 2.0


@dataclass(frozen=True)
class Neighbor:
    """A measured shape used for an estimate."""

    op: str
    seconds: float
    distance: float
    source: str


@dataclass(frozen=True)
class Estimate:
    """A variant's estimated seconds on an op, with how it was reached.

    ``method`` is ``"knn"``, ``"calibrated"`` or ``"roofline"``; ``roofline_s`` the variant's own
    roofline estimate (times wave quantization) the residual applies to; ``detail`` one line for
    ``tracea doctor``.
    """

    seconds: float
    method: str
    roofline_s: float
    detail: str = ""
    neighbors: tuple[Neighbor, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "method": self.method, "roofline_s": self.roofline_s, "detail": self.detail,
                "neighbors": [n.__dict__ for n in self.neighbors]}


@dataclass
class _Table:
    x: np.ndarray
    r: np.ndarray
    w: np.ndarray
    secs: np.ndarray
    ops: list[str]
    sources: list[str]


#: ops whose plain memory time is under this stay fully wave-quantized: a tiny op is bound by launch and
#: latency, where its tile count is what its neighbours' residuals were measured against
STREAMING_MIN_S = 1e-6


def roofline_estimate(variant: Any, op: Any, profile: Any, config: Any = None) -> float:
    """The variant's own estimate (its roofline with its efficiency) plus the wave quantization of
    ``config`` on GPUs (for variants that are ``wave_quantized``), weighted by :func:`wave_weight`: the
    idle SMs of a partial last wave cost (factor - 1) times the variant's compute time (FLOPs over the
    peak at its efficiency), never its fixed launch cost or memory time. (Until 2026-11-27 the factor
    multiplied the whole estimate: a batch-1 1x1 conv of 4 tiles read 33 x (5 us launch + compute), one of
    8 tiles 16.5 x, and the Doctor ranked variants by tile count alone where no measured shape was near.)"""
    base = float(variant.estimate_seconds(op, profile, config))
    if int(getattr(profile, "warp_size", 1) or 1) > 1 and getattr(variant, "wave_quantized", True):
        f = wave_factor(op, config, int(profile.compute_units or 0))
        if f != 1.0:
            base += (f - 1.0) * wave_weight(op, profile) * min(base, compute_seconds(variant, op, profile))
    return base


def compute_seconds(variant: Any, op: Any, profile: Any) -> float:
    """``op``'s FLOPs over the profile's peak for its dtype at the variant's ``efficiency`` (the part of an
    estimate that idle SMs stretch); the whole estimate where the op or profile has no such figures."""
    try:
        flop_t, _ = roofline_times(op, profile)
    except Exception:  # noqa: BLE001
        return math.inf
    return flop_t / max(float(getattr(variant, "efficiency", 1.0) or 1.0), 1e-6)


def wave_weight(op: Any, profile: Any) -> float:
    """How much of a config's wave quantization applies to ``op``: 1 on compute-bound ops, 0 on ops that
    stream memory.

    A partial last wave idles SMs' math, not the memory system: a memory-bound op streams at nearly the
    full bandwidth from a fraction of the SMs (H100, x @ W.T of 17-64 rows against 4096 x 4096 weights: 32
    CTAs of 128 weight rows ran 0.86x cuBLAS, 64 CTAs of 64 rows 0.92x -- far from the 4x and 2x the whole
    factor predicts, and the factor made the Doctor rank the 128-row GEMM first there at 0.63x). The weight
    rises from 0 to 1 as the compute share c = compute time / (compute + memory time) of the plain
    roofline goes from 1/4 to 3/4; ops whose memory time is under :data:`STREAMING_MIN_S` keep 1."""
    try:
        flop_t, mem_t = roofline_times(op, profile)
    except Exception:  # noqa: BLE001 - an op or profile without the figures: the whole factor
        return 1.0
    if mem_t < STREAMING_MIN_S:
        return 1.0
    c = flop_t / (flop_t + mem_t)
    return min(1.0, max(0.0, (c - 0.25) / 0.5))


class _TileConfig:
    """A stand-in config carrying only the tile of a data row (for the wave quantization)."""

    def __init__(self, tile: tuple[int, int]) -> None:
        self.tile_m, self.tile_n = tile


@dataclass
class PerfModel:
    """Estimates for one device (see the module docstring). Build with :meth:`fit`.

    ``arch`` is the architecture key; ``sources`` describes the data used; ``problems`` lists data
    that could not be used (files refused, rows skipped, unknown variants) -- shown by ``tracea doctor``.
    """

    arch: str
    tables: dict[tuple[str, tuple[Any, ...]], _Table] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def fit(cls, arch: str, observations: Iterable[Observation], variants: dict[str, Any], profile: Any,
            sources: list[str] | None = None, problems: list[str] | None = None,
            measured_on: dict[str, Any] | None = None) -> "PerfModel":
        """Residual tables of ``observations`` (held-out rows are never fitted) for the variants known here.
        ``measured_on`` maps an observation's ``source`` to the profile of the device it was measured on (its
        residual is against that device's roofline); other observations were measured on ``profile``'s."""
        measured_on = measured_on or {}
        model = cls(arch, sources=list(sources or []), problems=list(problems or []))
        rows: dict[tuple[str, tuple[Any, ...]], list[tuple[np.ndarray, float, float, float, str, str]]] = {}
        unknown: set[str] = set()
        for o in observations:
            if o.split == "heldout":
                continue
            v = variants.get(o.variant)
            if v is None:
                unknown.add(o.variant)
                continue
            try:
                base = roofline_estimate(v, o.op, measured_on.get(o.source, profile),
                                         _TileConfig(o.tile) if o.tile != (0, 0) else None)
                if not (base > 0 and math.isfinite(base)):
                    continue
                r = math.log(o.seconds / base)
                rows.setdefault((o.variant, group_key(o.op)), []).append(
                    (shape_vector(o.op), r, o.weight, o.seconds, o.op.describe(), o.source))
            except Exception:  # noqa: BLE001 - a variant whose estimate fails on a data op: skip the row
                continue
        for key, items in rows.items():
            model.tables[key] = _Table(np.stack([i[0] for i in items]), np.array([i[1] for i in items]),
                                       np.array([i[2] for i in items]), np.array([i[3] for i in items]),
                                       [i[4] for i in items], [i[5] for i in items])
        if unknown:
            model.problems.append(f"data for variants not registered here ignored: {', '.join(sorted(unknown))}")
        return model

    @property
    def points(self) -> int:
        return int(sum(len(t.r) for t in self.tables.values()))

    def has_data(self, variant: str) -> bool:
        return any(k[0] == variant for k in self.tables)

    def estimate(self, variant: Any, op: Any, profile: Any, config: Any = None,
                 roofline_s: float | None = None) -> Estimate:
        """The estimate of ``variant`` running ``op`` with ``config`` (see the module docstring)."""
        base = roofline_s if roofline_s is not None else roofline_estimate(variant, op, profile, config)
        table = self.tables.get((variant.name, group_key(op)))
        if table is None:
            why = ("no measured data for this variant" if not self.has_data(variant.name)
                   else "no measured data for this op group (dtype / precision / layout)")
            return Estimate(base, "roofline", base, f"{why} on {self.arch}: roofline estimate")
        d = np.sqrt((((table.x - shape_vector(op)) ** 2).sum(axis=1)))
        order = np.argsort(d, kind="stable")[:K_NEAREST]
        near = order[d[order] <= RADIUS]
        local = d <= CALIBRATION_RADIUS
        n = int(local.sum())
        r_cal = float(np.median(table.r[local])) * n / (n + CALIBRATION_SHRINK) if n else 0.0
        if len(near):
            w = table.w[near] * np.exp(-0.5 * (d[near] / BANDWIDTH) ** 2)
            r_hat = float(((w * table.r[near]).sum() + PRIOR_WEIGHT * r_cal) / (w.sum() + PRIOR_WEIGHT))
            nb = tuple(Neighbor(table.ops[i], float(table.secs[i]), float(d[i]), table.sources[i]) for i in near)
            est = base * math.exp(r_hat)
            return Estimate(est, "knn", base, f"{len(near)} measured shape(s) within {RADIUS} (nearest "
                            f"{nb[0].op} at {nb[0].distance:.2f}: {nb[0].seconds * 1e3:.4g} ms); "
                            f"{est / base:.2f}x the roofline", nb)
        i = int(order[0])
        nb = (Neighbor(table.ops[i], float(table.secs[i]), float(d[i]), table.sources[i]),)
        if not n:
            return Estimate(base, "roofline", base, f"no measured shape within {CALIBRATION_RADIUS} on {self.arch} "
                            f"(nearest {table.ops[i]} at {d[i]:.2f}): roofline estimate", nb)
        est = base * math.exp(r_cal)
        return Estimate(est, "calibrated", base, f"no measured shape within {RADIUS} (nearest {table.ops[i]} at "
                        f"{d[i]:.2f}); the variant's median measured/roofline ratio over the {n} shapes within "
                        f"{CALIBRATION_RADIUS}: {est / base:.2f}x the roofline", nb)

    def describe(self) -> str:
        """One line: architecture, data points, sources."""
        return (f"performance model for {self.arch}: {self.points} measured points"
                + (f" from {', '.join(self.sources)}" if self.sources else ""))
