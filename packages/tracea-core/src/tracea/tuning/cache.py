"""The persistent tuning cache: the best config found per (op, variant, environment fingerprint, goal).

Location: ``TRACEA_CACHE_PATH`` if set, else ``$TRACEA_CACHE_DIR/tuning_cache.json``, else
``./.tracea/tuning_cache.json``. :func:`get_cache` returns the process default, :func:`set_cache`
replaces it (tests, ``Context(cache=...)``).

Lookups are dictionary reads after the first load (an ``os.stat`` at most every
:attr:`TuningCache.recheck_s` seconds notices other processes' writes). Writes lock
``<file>.lock``, re-read the file, merge and atomically replace it, so concurrent tuners never lose
each other's results and readers never see a partial file. See :mod:`tracea.tuning.cache_file` for
the format and the handling of corrupt files.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .._version import __version__
from ..doctor.profile import DeviceProfile
from ..ir.ops import Op
from ..runtime import plans
from ..semantic.config import PipelineConfig
from . import cache_file, fingerprint as fp
from .cache_file import TuningCacheWarning
from .cache_schema import entry_key, entry_problem
from .locking import FileLock
from .goals import OptimizationGoal

ENV_PATH = "TRACEA_CACHE_PATH"
ENV_DIR = "TRACEA_CACHE_DIR"
DEFAULT_GOAL = OptimizationGoal.MaximizeTFLOPS
_LOOKUP_ORDER = (DEFAULT_GOAL,) + tuple(g for g in OptimizationGoal if g is not DEFAULT_GOAL)


@dataclass(frozen=True)
class CacheEntry:
    """One tuned result. ``median_s``/``p90_s``/``cv`` are the measured statistics of ``config``;
    ``score_s`` is the tuning goal's score; ``fingerprint`` hashes ``env`` (the environment facts);
    ``default_s`` is the median time of the variant's default config (its first valid hero, what an
    untuned call runs) measured in the same tuning run, 0.0 when it was not measured -- the
    performance model (:mod:`tracea.perfmodel`) learns from it."""

    op_key: str
    variant: str
    fingerprint: str
    goal: OptimizationGoal
    config: PipelineConfig
    median_s: float
    p90_s: float = 0.0
    cv: float = 0.0
    score_s: float = 0.0
    trials: int = 0
    backend: str = ""
    device: str = ""
    device_name: str = ""
    device_fp: str = ""
    op: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    tuned_at: float = 0.0
    tracea_version: str = __version__
    default_s: float = 0.0

    @property
    def key(self) -> str:
        return entry_key(self.op_key, self.variant, self.fingerprint, self.goal)

    def to_json(self) -> dict[str, Any]:
        return {"op_key": self.op_key, "op": self.op, "variant": self.variant, "backend": self.backend,
                "fingerprint": self.fingerprint, "device": self.device, "device_name": self.device_name,
                "device_fp": self.device_fp, "goal": self.goal.value, "config": self.config.to_dict(),
                "median_s": self.median_s, "p90_s": self.p90_s, "cv": self.cv, "score_s": self.score_s,
                "trials": self.trials, "env": self.env, "tuned_at": self.tuned_at,
                "tracea_version": self.tracea_version, "default_s": self.default_s}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CacheEntry":
        return cls(op_key=str(d["op_key"]), variant=str(d["variant"]), fingerprint=str(d["fingerprint"]),
                   goal=OptimizationGoal.parse(d.get("goal")), config=PipelineConfig.from_dict(d["config"]),
                   median_s=float(d["median_s"]), p90_s=float(d.get("p90_s", 0.0)), cv=float(d.get("cv", 0.0)),
                   score_s=float(d.get("score_s", d["median_s"])), trials=int(d.get("trials", 0)),
                   backend=str(d.get("backend", "")), device=str(d.get("device", "")),
                   device_name=str(d.get("device_name", "")), device_fp=str(d.get("device_fp", "")),
                   op=dict(d.get("op") or {}), env=dict(d.get("env") or {}),
                   tuned_at=float(d.get("tuned_at", 0.0)), tracea_version=str(d.get("tracea_version", "")),
                   default_s=float(d.get("default_s", 0.0)))


def default_path() -> str:
    """Where the default cache lives, from the environment (see the module docstring).

    Called on every dispatch (to notice a changed environment), so the resolution is memoised."""
    return _resolve_path(os.environ.get(ENV_PATH), os.environ.get(ENV_DIR), os.getcwd())


@functools.lru_cache(maxsize=16)
def _resolve_path(path: str | None, directory: str | None, cwd: str) -> str:
    if path:
        return os.path.abspath(os.path.expanduser(path))
    directory = directory or os.path.join(cwd, ".tracea")
    return os.path.abspath(os.path.join(os.path.expanduser(directory), "tuning_cache.json"))


class TuningCache:
    """A tuning cache backed by one JSON file (see the module docstring).

    :param path: the file; created (with its directory) on the first :meth:`put`.
    :param plugin_manager: where fingerprint facts come from (default: the process-wide manager).
    """

    recheck_s: float = 1.0

    def __init__(self, path: str | os.PathLike[str], *, plugin_manager: Any = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._pm = plugin_manager
        self._lock = threading.RLock()
        self._entries: dict[str, CacheEntry] = {}
        self._raw: dict[str, dict[str, Any]] = {}  # the entries' JSON as last read or written
        self._by_op_variant: dict[tuple[str, str], list[CacheEntry]] = {}
        self._loaded = False
        self._state: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self._fp_memo: dict[Any, tuple[str, dict[str, Any]]] = {}
        self._fp_fast: dict[tuple[str, int], tuple[DeviceProfile, tuple[str, dict[str, Any]] | None]] = {}
        self._variants: dict[str, Any] | None = None
        self._generation = 0
        self._unsaved: dict[str, dict[str, Any]] = {}  # entries a failed write kept in memory only
        self._quiet = False

    @property
    def generation(self) -> int:
        """A counter that changes whenever the entries change (here or, seen through the file, in
        another process); the Doctor keys its memoised decisions on it."""
        self._ensure_fresh()
        return self._generation

    # -- fingerprints -----------------------------------------------------------------------------
    @property
    def plugin_manager(self) -> Any:
        return self._pm if self._pm is not None else fp.plugin_manager()

    def fingerprint(self, variant: Any, op: Op, profile: DeviceProfile,
                    op_key: str | None = None) -> tuple[str, dict[str, Any]]:
        """(hash, facts) of ``variant`` (object or name) on ``profile`` for ``op``; memoised per
        (variant, profile object), and per op only for variants with an op-dependent source hash."""
        name = variant if isinstance(variant, str) else variant.name
        fast = self._fp_fast.get((name, id(profile)))
        if fast is not None and fast[0] is profile:
            if fast[1] is not None:
                return fast[1]
            op_key = op_key or op.key
            hit = self._fp_memo.get((name, profile, op_key))
            if hit is not None:
                return hit
        v = self._variant_obj(variant)
        per_op = v is not None and fp.uses_op(v)
        memo_key = (name, profile, (op_key or op.key) if per_op else None)
        hit = self._fp_memo.get(memo_key)
        if hit is None:
            facts = fp.fingerprint_fields(v if v is not None else _Named(name), op, profile, self.plugin_manager)
            hit = (fp.fingerprint(facts), facts)
            self._fp_memo[memo_key] = hit
        self._fp_fast[(name, id(profile))] = (profile, None if per_op else hit)
        return hit

    def _variant_obj(self, variant: Any) -> Any:
        if not isinstance(variant, str):
            return variant
        if self._variants is None:
            found: dict[str, Any] = {}
            try:
                for r in self.plugin_manager.hook.tracea_register_variants():
                    for v in (r if isinstance(r, (list, tuple)) else [r]) if r else []:
                        found.setdefault(v.name, v)
            except Exception:  # noqa: BLE001 - fingerprinting must not fail on a broken plugin
                pass
            self._variants = found
        return self._variants.get(variant)

    def forget_fingerprints(self) -> None:
        """Drop memoised fingerprints (after a driver/toolkit change inside one process, or in tests)."""
        self._fp_memo.clear()
        self._fp_fast.clear()
        self._variants = None

    # -- reading ----------------------------------------------------------------------------------
    def _ensure_fresh(self) -> None:
        now = time.monotonic()
        if self._loaded and now - self._checked_at < self.recheck_s:
            return
        with self._lock:
            self._checked_at = now
            state = cache_file.file_state(self.path)
            if self._loaded and state == self._state:
                return
            try:
                raw = cache_file.load(self.path).entries
            except Exception as exc:  # noqa: BLE001 - a cache problem never blocks dispatch
                cache_file.warn_once(f"load:{self.path}:{type(exc).__name__}",
                                     f"tuning cache {self.path} could not be read ({type(exc).__name__}: "
                                     f"{exc}); continuing without it")
                raw = {}
            raw.update(self._unsaved)
            # The state of the file read: the read holds no lock, so a writer may replace the file between
            # the stat above and the stat after it; the new file's state must not be noted as the one
            # read, or the next put would merge into this older copy and drop the writer's entries (the
            # 3-process CI fuzz lost 1 of 32 once). Unsure: no state, and the next put reads again.
            after = cache_file.file_state(self.path)
            self._install(raw, state if state == after else None)

    def _install(self, raw: dict[str, dict[str, Any]], state: tuple[int, int, int] | None) -> None:
        entries: dict[str, CacheEntry] = {}
        old_raw, old = self._raw, self._entries
        for key, d in raw.items():
            if old_raw.get(key) is d and key in old:  # (the same JSON object: the entry built from it)
                entries[key] = old[key]
                continue
            try:
                entries[key] = CacheEntry.from_json(d)
            except Exception:  # noqa: BLE001 - validated by cache_schema already; never fatal
                continue
        self._raw = raw
        by: dict[tuple[str, str], list[CacheEntry]] = {}
        for e in entries.values():
            by.setdefault((e.op_key, e.variant), []).append(e)
        self._entries, self._by_op_variant = entries, by
        self._state, self._loaded = state, True
        self._generation += 1
        plans.cache_changed(self, decisive=not self._quiet)

    def reload(self) -> None:
        """Re-read the file now."""
        with self._lock:
            self._loaded = False
            self._checked_at = 0.0
        self._ensure_fresh()

    def lookup(self, op: Op, variant: Any, profile: DeviceProfile,
               goal: OptimizationGoal | str | None = None) -> CacheEntry | None:
        """The entry tuned for ``op`` with ``variant`` (object or name) in this exact environment.

        With ``goal`` None, the entry tuned for MaximizeTFLOPS, else one tuned for any goal.
        Returns None on a miss (never tuned here, or the fingerprint changed).
        """
        self._ensure_fresh()
        name = variant if isinstance(variant, str) else variant.name
        op_key = op.key
        if (op_key, name) not in self._by_op_variant:
            return None
        fingerprint, _ = self.fingerprint(variant, op, profile, op_key)
        goals = (OptimizationGoal.parse(goal),) if goal is not None else _LOOKUP_ORDER
        for g in goals:
            e = self._entries.get(f"{op_key}|{name}|{fingerprint}|{g.value}")
            if e is not None:
                return e
        return None

    def best(self, op: Op, profile: DeviceProfile, goal: OptimizationGoal | str | None = None,
             variants: Iterable[Any] | None = None) -> CacheEntry | None:
        """The fastest valid entry for ``op`` on ``profile`` across variants (by median, or the goal's
        score when ``goal`` is given). ``variants`` restricts the variants considered."""
        self._ensure_fresh()
        key = op.key
        allowed = None if variants is None else {v if isinstance(v, str) else v.name for v in variants}
        best: CacheEntry | None = None
        for (op_key, name), _ in self._by_op_variant.items():
            if op_key != key or (allowed is not None and name not in allowed):
                continue
            if self._variant_obj(name) is None and variants is None:
                continue  # its backend is not installed here
            obj = next((v for v in (variants or []) if not isinstance(v, str) and v.name == name), name)
            e = self.lookup(op, obj, profile, goal)
            if e is None:
                continue
            if best is None or _rank(e, goal) < _rank(best, goal):
                best = e
        return best

    def stale(self, op: Op, variant: Any) -> list[CacheEntry]:
        """Every entry for ``op`` and ``variant`` whatever its fingerprint, newest first (search seeds)."""
        self._ensure_fresh()
        name = variant if isinstance(variant, str) else variant.name
        return sorted(self._by_op_variant.get((op.key, name), []), key=lambda e: -e.tuned_at)

    def entries(self) -> list[CacheEntry]:
        """All entries, sorted by op then variant."""
        self._ensure_fresh()
        return sorted(self._entries.values(), key=lambda e: (e.op_key, e.variant, e.goal.value, -e.tuned_at))

    def __len__(self) -> int:
        self._ensure_fresh()
        return len(self._entries)

    # -- writing ----------------------------------------------------------------------------------
    def make_entry(self, op: Op, variant: Any, profile: DeviceProfile, config: PipelineConfig,
                   stats: dict[str, float], *, goal: OptimizationGoal | str | None = None,
                   trials: int = 0) -> CacheEntry:
        """Build the entry recording ``config`` with measured ``stats`` (see :func:`goals.time_stats`;
        ``stats["default_s"]``, when present, is the default config's median time)."""
        g = OptimizationGoal.parse(goal)
        fingerprint, facts = self.fingerprint(variant, op, profile)
        name = variant if isinstance(variant, str) else variant.name
        return CacheEntry(op_key=op.key, variant=name, fingerprint=fingerprint, goal=g, config=config,
                          median_s=float(stats["median_s"]), p90_s=float(stats.get("p90_s", 0.0)),
                          cv=float(stats.get("cv", 0.0)), score_s=float(stats.get("score_s", stats["median_s"])),
                          trials=trials, backend=str(getattr(variant, "backend", "") or ""),
                          device=str(profile.device), device_name=profile.name,
                          device_fp=fp.device_fingerprint(profile), op=_op_json(op), env=facts,
                          tuned_at=time.time(), default_s=float(stats.get("default_s", 0.0) or 0.0))

    def put(self, *entries: CacheEntry, quiet: bool = False) -> bool:
        """Record entries (replacing same-key ones) and persist them atomically; True when written.

        An entry that would not survive reading back (a non-finite or negative time, an oversized
        field: see :func:`tracea.tuning.cache_schema.entry_problem`) is not recorded and warns. An
        unwritable location warns and keeps the entries in memory for this process. ``quiet``: the
        entries change no dispatch decision (the torch arbiter's verdicts), so this process's call plans
        are kept.
        """
        good: dict[str, dict[str, Any]] = {}
        for e in entries:
            d = e.to_json()
            why = entry_problem(e.key, d)
            if why is None:
                good[e.key] = d
            else:
                cache_file.warn(f"not recording the tuning-cache entry {e.key[:120]} in {self.path}: {why}")
        if not good:
            return False
        self._quiet = quiet
        try:
            return self._update(lambda raw: raw.update(good))
        finally:
            self._quiet = False

    def remove(self, predicate: Callable[[CacheEntry], bool]) -> int:
        """Delete the entries for which ``predicate`` is true; returns how many."""
        doomed: list[str] = []

        def edit(raw: dict[str, dict[str, Any]]) -> None:
            for key, d in list(raw.items()):
                try:
                    hit = predicate(CacheEntry.from_json(d))
                except Exception:  # noqa: BLE001
                    hit = False
                if hit:
                    doomed.append(key)
                    del raw[key]

        self._update(edit)
        return len(doomed)

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        return self.remove(lambda e: True)

    def export(self, path: str, entries: Iterable[CacheEntry] | None = None) -> int:
        """Write ``entries`` (default: all) to a new cache file at ``path``; returns the count."""
        chosen = list(self.entries() if entries is None else entries)
        cache_file.write_entries(os.path.abspath(path), {e.key: e.to_json() for e in chosen})
        return len(chosen)

    def import_file(self, path: str, *, replace: bool = False) -> int:
        """Merge the entries of another cache file (its own fingerprints are kept, so they only hit
        where the environment matches). Existing entries win unless ``replace``; returns how many
        entries were added or replaced."""
        from ..errors import CacheError

        loaded = cache_file.load(os.path.abspath(path), handle_corrupt=False)
        if loaded.state == cache_file.MISSING:
            raise CacheError(f"{path} does not exist")
        if loaded.state in (cache_file.CORRUPT, cache_file.UNUSABLE):
            raise CacheError(f"{path} is not a readable Tracea tuning cache ({loaded.why})")
        if loaded.state == cache_file.DAMAGED:
            cache_file.warn(f"importing {path} without its bad parts: {loaded.why}")
        raw = loaded.entries
        added: list[str] = []

        def edit(cur: dict[str, dict[str, Any]]) -> None:
            for key, d in raw.items():
                if replace or key not in cur:
                    cur[key] = d
                    added.append(key)

        self._update(edit)
        return len(added)

    def _update(self, edit: Callable[[dict[str, dict[str, Any]]], None]) -> bool:
        with self._lock:
            try:
                with FileLock(self.path + ".lock"):
                    state = cache_file.file_state(self.path)
                    if self._loaded and state is not None and state == self._state:
                        # the file is the one this process last read or wrote (no other writer since:
                        # a write replaces the file, so its inode, size or time differ): not parsed and
                        # validated again (a DenseNet-121's first forward writes ~120 verdicts and tuned
                        # entries, each of which re-read the whole file)
                        raw = dict(self._raw)
                    else:
                        loaded = cache_file.load(self.path, locked=True)
                        if not loaded.writable:  # a directory, FIFO, unreadable file ...: not ours to replace
                            raise OSError(f"{loaded.why}; it is left alone")
                        raw = loaded.entries
                        if loaded.state in (cache_file.CORRUPT, cache_file.DAMAGED):
                            for key, e in self._entries.items():  # keep what this process knew before the damage
                                raw.setdefault(key, e.to_json())
                    raw.update(self._unsaved)
                    edit(raw)
                    cache_file.write_entries(self.path, raw)
                    self._unsaved.clear()
                    self._install(raw, cache_file.file_state(self.path))
                    self._checked_at = time.monotonic()
                return True
            except OSError as exc:
                cache_file.warn(f"could not write the tuning cache {self.path} ({exc}); results are kept "
                                f"in memory for this process only (set {ENV_PATH} to a writable file)")
            except Exception as exc:  # noqa: BLE001 - CacheError from a lock timeout
                cache_file.warn(f"could not update the tuning cache {self.path}: {exc}")
            raw = {k: e.to_json() for k, e in self._entries.items()}
            before = dict(raw)
            edit(raw)
            for key in set(before) - set(raw):
                self._unsaved.pop(key, None)
            self._unsaved.update({k: d for k, d in raw.items() if before.get(k) is not d})
            self._install(raw, self._state)
            return False


class _Named:
    """Stand-in for a variant known only by name (its backend is not installed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.backend = name.split(".", 1)[0]


def _rank(e: CacheEntry, goal: OptimizationGoal | str | None) -> float:
    return e.median_s if goal is None else (e.score_s if e.goal is OptimizationGoal.parse(goal) else e.median_s)


def _op_json(op: Op) -> dict[str, Any]:
    try:
        return op.to_dict()
    except Exception:  # noqa: BLE001
        return {}


_default: TuningCache | None = None
_explicit = False
_default_lock = threading.Lock()


def get_cache() -> TuningCache:
    """The process-default cache (see the module docstring for its location)."""
    global _default
    cache = _default
    if cache is not None and (_explicit or cache.path == default_path()):
        return cache
    with _default_lock:
        if _default is None or (not _explicit and _default.path != default_path()):
            _default = TuningCache(default_path())
        return _default


def set_cache(cache: TuningCache | str | os.PathLike[str] | None) -> None:
    """Make ``cache`` (or a cache at a path) the process default; None returns to the environment's."""
    global _default, _explicit
    with _default_lock:
        if cache is None:
            _default, _explicit = None, False
        else:
            _default = cache if isinstance(cache, TuningCache) else TuningCache(cache)
            _explicit = True


plans.watch_cache(get_cache)

__all__ = ["CacheEntry", "TuningCache", "TuningCacheWarning", "get_cache", "set_cache", "default_path"]
