"""Measured data for the performance model: the files backends ship and the user's tuning records.

A data file (JSON) holds the times of variants' *default* configs (the first valid hero, what an untuned
call runs) on many shapes, measured on one architecture::

    {"format": "tracea-perf-data", "version": 1, "backend": "cuda", "arch_key": "sm_90",
     "device_name": "NVIDIA H100 80GB HBM3", "measured_at": "...", "method": "...",
     "columns": ["variant", "op", "seconds", "family", "split", "tile"],
     "rows": [["cuda.gemm.wgmma", {"kind": "gemm", "m": 512, ...}, 2.1e-05, "llama7b", "fit", [128, 256]], ...],
     "anchor": [[{"kind": "gemm", ...}, 1.9e-05, "llama7b", "fit"], ...],      # optional: torch's times
     "profile": {...}}                                                         # optional: the device

``profile`` (the measuring device's ``DeviceProfile.to_dict()``) lets the model read the times as efficiencies of
*that* device's roofline: another GPU of the architecture with more bandwidth (an H200 using H100 data) gets
estimates scaled to its own roofline (:func:`roofline_profile`).

``split`` is ``"fit"`` or ``"heldout"``: held-out rows (whole shape families) are never fitted; they
measure the model (``benchmarks/model/eval_model.py``). ``tile`` is the default config's (tile_m,
tile_n), [0, 0] when it has none.

Nothing here raises on bad data: an unreadable or malformed file is dropped with a reason, a bad
row is skipped and counted; dispatch then falls back to the roofline for whatever lacks data.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable

from ..ir.ops import Op, op_from_dict

FORMAT = "tracea-perf-data"
VERSION = 1
#: files larger than this are refused (a data file is a few hundred KB)
MAX_BYTES = 16 * 2**20
COLUMNS = ("variant", "op", "seconds", "family", "split", "tile")


@dataclass(frozen=True)
class Observation:
    """One measured time of a variant's default config on one op."""

    variant: str
    op: Op
    seconds: float
    source: str = ""
    family: str = ""
    split: str = "fit"
    tile: tuple[int, int] = (0, 0)
    weight: float = 1.0


@dataclass
class DataFile:
    """A loaded data file: its header facts, its usable observations and what was wrong with it."""

    path: str
    arch_key: str = ""
    backend: str = ""
    device_name: str = ""
    observations: tuple[Observation, ...] = ()
    anchor_rows: tuple[Any, ...] = ()
    profile: dict[str, Any] | None = None
    problem: str = ""          # why the whole file was refused ('' when loaded)
    skipped_rows: int = 0      # malformed rows left out

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def anchor(self) -> tuple[tuple[Op, float, str, str], ...]:
        """(op, seconds, family, split) of the anchor (e.g. PyTorch) rows, parsed on first use (reports
        only: dispatch never reads them); malformed rows are left out."""
        out = []
        for row in self.anchor_rows:
            try:
                op, secs = op_from_dict(dict(row[0])), float(row[1])
                if _positive(secs):
                    out.append((op, secs, str(row[2]) if len(row) > 2 else "", str(row[3]) if len(row) > 3 else "fit"))
            except Exception:  # noqa: BLE001 - anchors are for reports only
                continue
        return tuple(out)


def load_file(path: str | os.PathLike[str]) -> DataFile:
    """Read and validate one data file; never raises (see :class:`DataFile`.problem)."""
    path = os.fspath(path)
    out = DataFile(path=path)
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            out.problem = f"{size} bytes is more than the {MAX_BYTES} a data file may have"
            return out
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        out.problem = f"unreadable: {type(exc).__name__}: {str(exc)[:120]}"
        return out
    return parse(raw, path)


def parse(raw: Any, path: str = "<data>") -> DataFile:
    """Validate a decoded data file (see the module docstring)."""
    out = DataFile(path=path)
    if not isinstance(raw, dict):
        out.problem = f"a data file is a JSON object, not {type(raw).__name__}"
        return out
    if raw.get("format") != FORMAT:
        out.problem = f"format is {str(raw.get('format'))[:40]!r}, not {FORMAT!r}"
        return out
    if raw.get("version") != VERSION:
        out.problem = f"version {str(raw.get('version'))[:20]} is not supported (this Tracea reads {VERSION})"
        return out
    arch = raw.get("arch_key")
    if not isinstance(arch, str) or not arch:
        out.problem = "arch_key must be a non-empty string"
        return out
    cols = raw.get("columns")
    rows = raw.get("rows")
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols) or not {"variant", "op", "seconds"} <= set(cols):
        out.problem = "columns must list at least variant, op and seconds"
        return out
    if not isinstance(rows, list):
        out.problem = "rows must be a list"
        return out
    out.arch_key = arch
    out.backend = str(raw.get("backend") or "")
    out.device_name = str(raw.get("device_name") or "")
    out.profile = raw.get("profile") if isinstance(raw.get("profile"), dict) else None
    index = {c: i for i, c in enumerate(cols)}
    obs: list[Observation] = []
    source = os.path.basename(path)
    ops: dict[str, Op] = {}  # rows of one shape share its op (several variants were timed on it)
    for row in rows:
        o = _row(row, index, source, ops)
        if o is None:
            out.skipped_rows += 1
        else:
            obs.append(o)
    out.observations = tuple(obs)
    anchor = raw.get("anchor")
    out.anchor_rows = tuple(r for r in anchor if isinstance(r, list) and len(r) >= 2) if isinstance(anchor, list) else ()
    return out


def roofline_profile(profile: Any, recorded: Any) -> Any:
    """``profile`` with the roofline figures (bandwidth, peak FLOP/s per dtype, compute units) of the
    device a data file was measured on, where its ``profile`` records valid ones; anything else stays
    ``profile``'s (a file's figures are validated like its rows: a bad value is ignored)."""
    if not isinstance(recorded, dict) or not hasattr(profile, "with_"):
        return profile
    changes: dict[str, Any] = {}
    bw = recorded.get("bandwidth_gbs")
    if isinstance(bw, (int, float)) and not isinstance(bw, bool) and _positive(float(bw)):
        changes["bandwidth_gbs"] = float(bw)
    peaks = recorded.get("peak_gflops")
    if isinstance(peaks, dict):
        good = {str(k): float(v) for k, v in peaks.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and _positive(float(v))}
        if good:
            changes["peak_gflops"] = good
    units = recorded.get("compute_units")
    if isinstance(units, int) and not isinstance(units, bool) and 0 < units < 1 << 20:
        changes["compute_units"] = units
    return profile.with_(**changes) if changes else profile


def _positive(v: float) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0


def _row(row: Any, index: dict[str, int], source: str, ops: dict[str, Op]) -> Observation | None:
    if not isinstance(row, list) or len(row) < len(index):
        return None
    try:
        variant = row[index["variant"]]
        if not isinstance(variant, str) or not variant:
            return None
        secs = row[index["seconds"]]
        if isinstance(secs, bool) or not isinstance(secs, (int, float)):
            return None
        secs = float(secs)
        if not _positive(secs) or secs > 3600:
            return None
        op_raw = row[index["op"]]
        if not isinstance(op_raw, dict):
            return None
        key = json.dumps(op_raw, sort_keys=True)
        op = ops.get(key)
        if op is None:
            op = ops[key] = op_from_dict(dict(op_raw))
        family = str(row[index["family"]]) if "family" in index else ""
        split = str(row[index["split"]]) if "split" in index else "fit"
        tile = (0, 0)
        if "tile" in index:
            t = row[index["tile"]]
            if isinstance(t, list) and len(t) == 2 and all(isinstance(x, int) and 0 <= x < 2**16 for x in t):
                tile = (int(t[0]), int(t[1]))
        return Observation(variant, op, secs, source, family, split, tile)
    except Exception:  # noqa: BLE001 - a bad op dict (unknown field, bad value) skips the row
        return None


def user_observations(entries: Iterable[Any], device_fp: str) -> list[Observation]:
    """Observations from tuning-cache entries of this device (same device fingerprint) that recorded
    their variant's default-config time (``default_s``; entries without it are not used: their tuned
    time says nothing about what an untuned call runs). User data counts twice a shipped point."""
    out = []
    for e in entries:
        try:
            secs = float(getattr(e, "default_s", 0.0) or 0.0)
            if not _positive(secs) or getattr(e, "device_fp", "") != device_fp or not e.op:
                continue
            out.append(Observation(e.variant, op_from_dict(dict(e.op)), secs, "your tuning cache", "user", "fit",
                                   weight=2.0))
        except Exception:  # noqa: BLE001 - a foreign or damaged entry is skipped
            continue
    return out


def pack(rows: list[dict[str, Any]], header: dict[str, Any], anchor: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A data file object from raw measurement dicts (``variant``, ``op`` (dict), ``seconds``, ``family``,
    ``split``, ``tile``), op dicts trimmed of default fields."""
    from ..ir.ops import OP_TYPES  # noqa: PLC0415

    defaults: dict[str, dict[str, Any]] = {}

    def trim(d: dict[str, Any]) -> dict[str, Any]:
        kind = d["kind"]
        if kind not in defaults:
            defaults[kind] = _defaults(OP_TYPES[kind])
        return {k: v for k, v in d.items() if k == "kind" or defaults[kind].get(k, _MISSING) != v}

    out = {"format": FORMAT, "version": VERSION, **header, "columns": list(COLUMNS),
           "rows": [[r["variant"], trim(r["op"]), float(r["seconds"]), r.get("family", ""), r.get("split", "fit"),
                     list(r.get("tile") or (0, 0))] for r in rows]}
    if anchor:
        out["anchor"] = [[trim(a["op"]), float(a["seconds"]), a.get("family", ""), a.get("split", "fit")] for a in anchor]
    return out


_MISSING = object()


def _defaults(cls: type) -> dict[str, Any]:
    from dataclasses import MISSING, fields  # noqa: PLC0415

    out = {}
    for f in fields(cls):
        if f.default is not MISSING:
            v = f.default
            out[f.name] = getattr(v, "value", v) if not isinstance(v, (tuple, list)) else list(v)
    return out
