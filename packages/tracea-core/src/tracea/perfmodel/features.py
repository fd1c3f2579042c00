"""What the performance model knows about an op, a device and a config, as numbers.

- :func:`arch_key`: which measured data applies to a device (``sm_90``; ``cpu-intel-avx512``,
  ``cpu-amd-zen4-avx512``, ``cpu-x86-avx2``, ...): data measured on another architecture never applies.
- :func:`group_key`: ops whose times are compared at all (same op kind, input dtype, fp32 precision,
  conv layout): a bf16 GEMM never borrows an fp32 GEMM's time.
- :func:`shape_vector`: the op's position in log2-shape space (GEMM M, N, K, batch; conv M = N*P*Q,
  K, C*R*S, R*S, stride) plus alignment and transposes, scaled so one unit is "a factor of two".
- :func:`wave_factor`: the GPU wave quantization of a tiled config (ceil(tiles / SMs) / (tiles / SMs)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.ops import Conv2dOp, GemmOp, Op
from ..semantic.config import PipelineConfig

#: distance added by a mismatch of a 0/1 feature (alignment, transposes): about "4x away in one dim"
FLAG_WEIGHT = 2.0


def arch_key(profile: Any) -> str:
    """The architecture key measured data is filed under for ``profile``'s device.

    CUDA: ``sm_<major><minor>`` (sm_90a and sm_90 share data). CPU: ``cpu-<family>-<isa>`` where the
    family tells full-rate AVX-512 (Intel, AMD Zen 5) from double-pumped AVX-512 (AMD Zen 4), so a
    machine of another family falls back to the roofline instead of borrowing foreign times.
    Other devices: ``<kind>-<name>``.
    """
    kind = profile.device.kind
    if kind == "cuda" and profile.compute_capability:
        major, minor = profile.compute_capability
        return f"sm_{major}{minor}"
    if kind == "cpu":
        micro = str(profile.extras.get("microarch") or "")
        if micro:
            return f"cpu-{micro}"
        return f"cpu-{_slug(profile.vendor or 'unknown')}-{profile.extras.get('best_isa', 'scalar')}"
    return f"{kind}-{_slug(profile.name)}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in str(text).lower()).strip("-") or "unknown"


def group_key(op: Op) -> tuple[Any, ...]:
    """Ops compared with each other: kind, input dtype, fp32 precision (float32 only), conv layout."""
    dts = op.dtypes
    dt = dts[0].storage if dts else DType.F32
    prec = getattr(op, "fp32_precision", None)
    prec_v = prec.value if (prec is not None and dt is DType.F32) else ""
    if isinstance(op, Conv2dOp):
        return (op.kind.value, dt.value, prec_v, op.layout.value, op.groups > 1)
    return (op.kind.value, dt.value, prec_v)


def _l2(x: float) -> float:
    return math.log2(max(float(x), 1.0))


def shape_vector(op: Op) -> np.ndarray:
    """The op's coordinates in log2-shape space (see the module docstring)."""
    if isinstance(op, GemmOp):
        epc = max(1, 16 // op.dtype_a.storage.itemsize)
        aligned = all(v % epc == 0 for v in (op.m if op.trans_a else op.k, op.k if op.trans_b else op.n, op.n))
        return np.array([_l2(op.m), _l2(op.n), _l2(op.k), _l2(op.batch), FLAG_WEIGHT * aligned,
                         FLAG_WEIGHT * op.trans_a, FLAG_WEIGHT * op.trans_b], dtype=np.float64)
    if isinstance(op, Conv2dOp):
        m, n, k = op.gemm_mnk
        epc = max(1, 16 // op.dtype.storage.itemsize)
        aligned = op.c % epc == 0 and op.k % epc == 0
        return np.array([_l2(m), _l2(n), _l2(k), _l2(op.r * op.s), float(op.stride[0]),
                         FLAG_WEIGHT * aligned, 0.0], dtype=np.float64)
    flops = float(getattr(op, "flops", 1) or 1)
    return np.array([_l2(flops), 0, 0, 0, 0, 0, 0], dtype=np.float64)


def wave_factor(op: Op, config: PipelineConfig | None, units: int) -> float:
    """GPU wave quantization of a tiled config: the last, partial wave of output tiles costs a full
    one; a ``split_k`` config counts each tile's pieces (at most one wave of them). 1.0 for configs without
    tiles, CPUs (``units`` <= 1 means unknown) and non-GEMM-like ops."""
    if config is None or units <= 1:
        return 1.0
    tm, tn = getattr(config, "tile_m", 0), getattr(config, "tile_n", 0)
    if not tm or not tn:
        return 1.0
    if isinstance(op, GemmOp):
        m, n, batch = op.m, op.n, op.batch
    elif isinstance(op, Conv2dOp):
        m, n, _ = op.gemm_mnk
        batch = 1
    else:
        return 1.0
    tiles = -(-m // tm) * -(-n // tn) * batch
    get = getattr(config, "get", None)
    split = int((get("split_k") if get is not None else 0) or 1)
    if split > 1:  # split-K: each tile runs as ``split`` pieces (capped at one wave, as the kernels do)
        tiles *= max(1, min(split, units // tiles))
    waves = tiles / units
    return math.ceil(waves) / waves if waves > 0 else 1.0


def roofline_times(op: Op, profile: Any, dtype: str | None = None) -> tuple[float, float]:
    """(FLOPs / peak, bytes / bandwidth) of ``op`` at 100% efficiency: the plain roofline's compute and
    memory times (20 GB/s where the profile has no bandwidth)."""
    dt = dtype or (op.dtypes[0].value if op.dtypes else "float32")
    peak = float(profile.peak(dt)) * 1e9
    bw = float(profile.bandwidth_gbs or 20.0) * 1e9
    return op.flops / max(peak, 1.0), op.min_bytes / bw


def roofline_seconds(op: Op, profile: Any, dtype: str | None = None) -> float:
    """max(FLOPs / peak, bytes / bandwidth) at 100% efficiency (the plain roofline, for reports)."""
    return max(roofline_times(op, profile, dtype))
