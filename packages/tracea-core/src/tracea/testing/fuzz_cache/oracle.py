"""What the cache fuzzer expects, computed independently of the code under test.

:func:`classify` applies the documented file-level rules of ``docs/tuning.md`` ("Cache robustness")
with Python's own ``json`` module: a file that breaks one (empty, too large, not UTF-8, not JSON,
nested deeper than 64, wrong structure, a version that is not an integer) must be kept aside whole;
a file with duplicate keys must be kept aside too; any other file is judged entry by entry, so an
entry the fuzzer did not touch must still be in the cache afterwards. The float64 references of the
dispatched ops are plain NumPy, not Tracea's reference backend.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

FORMAT = "tracea-tuning-cache"
MAX_BYTES = 64 << 20
MAX_DEPTH = 64
FILE, DUPLICATES, ENTRIES = "file", "duplicates", "entries"


def classify(data: bytes | None) -> tuple[str, dict[str, Any]]:
    """(verdict, entries): ``file`` (must be kept aside whole), ``duplicates`` (kept aside, entries
    as JSON's last-wins reading), or ``entries`` (judged per entry)."""
    if data is None or not data.strip() or len(data) > MAX_BYTES:
        return FILE, {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return FILE, {}
    dups = [0]

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        dups[0] += len(items) - len(out)
        return out

    def integer(s: str) -> int:  # any length is an integer (Python's own limit is 4300 digits)
        return int(s) if len(s) < 4000 else (-1 if s.startswith("-") else 1) * 10**50

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_int=integer)
    except Exception:  # noqa: BLE001 - ValueError, RecursionError (deep nesting), 4300-digit ints ...
        return FILE, {}
    if _depth(doc) > MAX_DEPTH:
        return FILE, {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        return FILE, {}
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        return FILE, {}
    return (DUPLICATES if dups[0] else ENTRIES), doc["entries"]


def _depth(value: Any, level: int = 1) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max([level] + [_depth(v, level + 1) for v in value.values()])
    if isinstance(value, list):
        return max([level] + [_depth(v, level + 1) for v in value])
    return level - 1 if level > 1 else 1


def same(a: Any, b: Any) -> bool:
    """JSON equality (NaN equal to NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def gemm_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def conv2d_ref(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """NCHW cross-correlation, stride 1, float64."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    p, q = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    out = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + p, j:j + q], w[:, :, i, j].astype(np.float64))
    return out


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v, float64, no mask, equal head counts."""
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    logits = q64 @ np.swapaxes(k64, -1, -2) / math.sqrt(q.shape[-1])
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    return (p / p.sum(axis=-1, keepdims=True)) @ v64


def rel_err(out: Any, ref: np.ndarray) -> float:
    o = np.asarray(out, dtype=np.float64)
    if o.shape != ref.shape or not np.isfinite(o).all():
        return math.inf
    return float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-300))
