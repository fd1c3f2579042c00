"""Reading and writing the tuning-cache JSON file: atomic replace, corrupt files moved aside.

File format (``version`` 1)::

    {"format": "tracea-tuning-cache", "version": 1,
     "entries": {"<op key>|<variant>|<fingerprint>|<goal>": {...entry...}, ...}}

Entries are plain JSON objects (see :class:`tracea.tuning.cache.CacheEntry`). Writers hold the lock
file, read the current file, merge, write ``<file>.tmp-<pid>-<n>`` and ``os.replace`` it over the
file, so readers see either the old or the new file, never a truncated one.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import warnings
from typing import Any

FORMAT = "tracea-tuning-cache"
VERSION = 1
_tmp_counter = itertools.count()


class TuningCacheWarning(UserWarning):
    """A tuning-cache file could not be read or written; the message names the file and what was done."""


def warn(message: str) -> None:
    warnings.warn(message, TuningCacheWarning, stacklevel=3)


def move_aside(path: str, why: str, *, copy: bool = False) -> str | None:
    """Move (or copy) a bad cache file to ``<path>.corrupt-<timestamp>`` and warn; returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    target = f"{path}.corrupt-{stamp}-{os.getpid()}"
    try:
        if copy:
            with open(path, "rb") as src, open(target, "wb") as dst:
                dst.write(src.read())
        else:
            os.replace(path, target)
    except OSError as exc:
        warn(f"tuning cache {path} is unusable ({why}) and could not be moved aside ({exc}); "
             f"it is ignored")
        return None
    verb = "copied" if copy else "moved"
    warn(f"tuning cache {path} is unusable ({why}); {verb} it to {target} and continuing "
         f"{'without the bad entries' if copy else 'with an empty cache'}")
    return target


def read_entries(path: str, *, handle_corrupt: bool = True) -> tuple[dict[str, dict[str, Any]], bool]:
    """The raw entries of the cache file at ``path`` and whether the file was corrupt.

    A missing file gives no entries. An unreadable file (permissions) warns and gives none, leaving
    the file alone. A file that is not a valid cache (truncated, bad JSON, wrong structure) warns and
    is moved aside when ``handle_corrupt``. Malformed single entries are dropped with a warning after
    the file is copied aside, so no data is silently lost.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}, False
    except OSError as exc:
        warn(f"tuning cache {path} cannot be read ({exc}); tuning results will not be reused")
        return {}, False
    if not raw.strip():
        if handle_corrupt:
            move_aside(path, "the file is empty")
        return {}, True
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if handle_corrupt:
            move_aside(path, f"not valid JSON: {exc}")
        return {}, True
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        if handle_corrupt:
            move_aside(path, f"not a Tracea tuning cache (expected an object with format={FORMAT!r} "
                             f"and an 'entries' object)")
        return {}, True
    if int(data.get("version", 0) or 0) > VERSION:
        warn(f"tuning cache {path} was written by a newer Tracea (format version {data.get('version')}); "
             f"reading the entries this version understands")
    entries: dict[str, dict[str, Any]] = {}
    bad: list[str] = []
    for key, entry in data["entries"].items():
        if isinstance(entry, dict) and isinstance(entry.get("config"), dict) and "variant" in entry:
            entries[key] = entry
        else:
            bad.append(str(key))
    if bad and handle_corrupt:
        move_aside(path, f"{len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} "
                         f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''})", copy=True)
    return entries, bool(bad)


def write_entries(path: str, entries: dict[str, dict[str, Any]]) -> None:
    """Atomically replace the file at ``path`` with ``entries`` (raises OSError on failure)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{next(_tmp_counter)}"
    data = {"format": FORMAT, "version": VERSION, "entries": dict(sorted(entries.items()))}
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def file_state(path: str) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of ``path`` or None when missing: a cheap change detector."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
