"""Parsing and validating tuning-cache files without trusting them.

:func:`parse` turns the bytes of a cache file into its entries, the keys of malformed entries and,
when the file as a whole is unusable, why. It never raises and never recurses on hostile input:

- nesting deeper than :data:`MAX_DEPTH` is refused before the JSON parser runs (a linear scan), so
  a file nested a thousand levels deep is a corrupt file, not a ``RecursionError``;
- integers of more than :data:`MAX_INT_DIGITS` digits are not converted (Python refuses beyond
  4300 digits with a ``ValueError``; huge values are hostile anyway): the entry holding one is
  malformed;
- duplicate object keys are counted (the last value wins, as in JSON), so the file is reported and
  copied aside instead of silently losing the earlier value;
- ``version`` must be an integer; anything else (``"abc"``, ``[1]``, ``1e400``, ``NaN``) makes the
  file corrupt.

:func:`entry_problem` says why one entry is malformed (types, finite non-negative times, a config
:class:`~tracea.semantic.config.PipelineConfig` accepts, a key that matches the entry's fields,
bounded strings and depth), or None.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

FORMAT = "tracea-tuning-cache"
VERSION = 1
#: deepest nesting of a cache file accepted (Tracea writes 5 levels).
MAX_DEPTH = 64
#: deepest nesting inside one entry (entry -> config -> params -> value is 3).
MAX_ENTRY_DEPTH = 6
#: longest integer literal converted; longer ones make their entry malformed.
MAX_INT_DIGITS = 40
#: longest string (key or value) inside an entry.
MAX_STRING = 4096

_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_TIMES = ("median_s", "p90_s", "cv", "score_s", "default_s")
_TEXT = ("backend", "device", "device_name", "device_fp", "tracea_version")


class HugeInt:
    """An integer literal too long to convert (kept as text; any entry holding one is malformed)."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<integer of {len(self.digits)} digits>"


@dataclass
class Parsed:
    """What :func:`parse` found: ``entries`` (valid), ``bad`` (``key: reason`` of malformed entries),
    ``problem`` (why the whole file is unusable, or None), ``duplicates`` (repeated object keys) and
    ``version`` (the file's format version)."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    problem: str | None = None
    duplicates: int = 0
    version: int = VERSION

    @property
    def damaged(self) -> bool:
        """True when something in the file is not kept (malformed entries or duplicate keys)."""
        return bool(self.bad) or self.duplicates > 0


def nesting_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests brackets deeper than ``limit`` (strings are skipped).

    Linear in the size: strings are removed by one regular-expression pass (an unterminated string
    runs to the end and still matches, so nothing is rescanned), the brackets left are summed with
    NumPy."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING_RE.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return False
    import numpy as np

    depth = 0
    chunk = 1 << 20
    for start in range(0, len(brackets), chunk):
        a = np.frombuffer(brackets, dtype=np.uint8, count=min(chunk, len(brackets) - start), offset=start)
        steps = np.where((a == ord("[")) | (a == ord("{")), 1, -1).astype(np.int64)
        running = np.cumsum(steps) + depth
        if int(running.max()) > limit:
            return True
        depth = int(running[-1])
    return False


def parse(raw: bytes) -> Parsed:
    """Parse and validate the bytes of a cache file (see the module docstring); never raises."""
    if not raw.strip():
        return Parsed(problem="the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Parsed(problem=f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    if nesting_exceeds(raw):
        return Parsed(problem=f"nested deeper than {MAX_DEPTH} levels")
    dups = [0]

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        dups[0] += len(items) - len(out)
        return out

    def integer(s: str) -> Any:
        return int(s) if len(s.lstrip("-")) <= MAX_INT_DIGITS else HugeInt(s)

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_int=integer)
    except Exception as exc:  # noqa: BLE001 - JSONDecodeError, RecursionError, MemoryError ...: corrupt
        return Parsed(problem=f"not valid JSON: {_short(exc)}")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return Parsed(problem=f"not a Tracea tuning cache (expected an object with format={FORMAT!r} "
                              f"and an 'entries' object)")
    version = data.get("version", VERSION)
    if isinstance(version, HugeInt):  # an integer all the same: far newer (or older) than this Tracea
        version = 0 if version.digits.startswith("-") else VERSION + 1
    if isinstance(version, bool) or not isinstance(version, int):
        return Parsed(problem=f"format version {_short(version)} is not an integer")
    out = Parsed(duplicates=dups[0], version=version)
    for key, entry in data["entries"].items():
        why = entry_problem(key, entry)
        if why is None:
            out.entries[key] = entry
        else:
            out.bad.append(f"{_short(key, 60)}: {why}")
    return out


def entry_problem(key: Any, entry: Any) -> str | None:
    """Why ``entry`` (stored under ``key``) is not a usable cache entry, or None when it is."""
    if not isinstance(entry, dict):
        return f"an entry must be an object, not {type(entry).__name__}"
    shape = _shape_problem(entry, 1)
    if shape:
        return shape
    for name in ("op_key", "variant", "fingerprint"):
        if not isinstance(entry.get(name), str) or not entry[name]:
            return f"{name} must be a non-empty string"
    for name in _TEXT:
        if name in entry and not isinstance(entry[name], str):
            return f"{name} must be a string"
    for name in ("op", "env"):
        if entry.get(name) is not None and not isinstance(entry[name], dict):
            return f"{name} must be an object"
    if not isinstance(entry.get("config"), dict):
        return "config must be an object"
    if "median_s" not in entry:
        return "median_s is missing"
    for name in _TIMES:
        if name in entry and not _non_negative(entry[name]):
            return f"{name}={_short(entry[name])} must be a finite non-negative number"
    if "trials" in entry and (isinstance(entry["trials"], bool) or not isinstance(entry["trials"], int)
                              or entry["trials"] < 0):
        return f"trials={_short(entry['trials'])} must be a non-negative integer"
    if "tuned_at" in entry and not _finite(entry["tuned_at"]):
        return f"tuned_at={_short(entry['tuned_at'])} must be a finite number"
    try:
        from ..semantic.config import PipelineConfig
        from .goals import OptimizationGoal

        goal = OptimizationGoal.parse(entry.get("goal"))
        PipelineConfig.from_dict(entry["config"])
    except Exception as exc:  # noqa: BLE001 - InvalidArgumentError and friends
        return _short(exc)
    expected = entry_key(entry["op_key"], entry["variant"], entry["fingerprint"], goal)
    if key != expected:
        return "its key does not match its op_key, variant, fingerprint and goal"
    return None


def entry_key(op_key: str, variant: str, fingerprint: str, goal: Any) -> str:
    """The key an entry is stored under: ``<op key>|<variant>|<fingerprint>|<goal>``."""
    return f"{op_key}|{variant}|{fingerprint}|{getattr(goal, 'value', goal)}"


def _shape_problem(value: Any, depth: int) -> str | None:
    """Bounded depth, bounded strings, no unconvertible integers, JSON types only."""
    if depth > MAX_ENTRY_DEPTH:
        return f"nested deeper than {MAX_ENTRY_DEPTH} levels"
    if isinstance(value, dict):
        for k, v in value.items():
            if len(k) > MAX_STRING:
                return f"a key of {len(k)} characters (limit {MAX_STRING})"
            why = _shape_problem(v, depth + 1)
            if why:
                return why
    elif isinstance(value, list):
        for v in value:
            why = _shape_problem(v, depth + 1)
            if why:
                return why
    elif isinstance(value, str):
        if len(value) > MAX_STRING:
            return f"a string of {len(value)} characters (limit {MAX_STRING})"
    elif isinstance(value, HugeInt):
        return f"an integer of {len(value.digits)} digits"
    elif value is not None and not isinstance(value, (bool, int, float)):
        return f"a value of type {type(value).__name__}"
    return None


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _non_negative(v: Any) -> bool:
    return _finite(v) and v >= 0


def _short(value: Any, limit: int = 80) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
