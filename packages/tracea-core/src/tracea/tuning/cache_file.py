"""Reading and writing the tuning-cache JSON file: atomic replace, damaged files set aside.

File format (``version`` 1)::

    {"format": "tracea-tuning-cache", "version": 1,
     "entries": {"<op key>|<variant>|<fingerprint>|<goal>": {...entry...}, ...}}

Entries are plain JSON objects (see :class:`tracea.tuning.cache.CacheEntry`). Writers hold the lock
file, read the current file, merge, write ``<file>.tmp-<pid>-<n>`` and ``os.replace`` it over the
file, so readers see either the old or the new file, never a truncated one. A symbolic link at the
cache path is followed: the file it points to is read and replaced, the link stays.

What a read does with a file that is not a clean cache (:func:`load`; parsing is
:mod:`tracea.tuning.cache_schema`):

- *corrupt* (empty, truncated, not UTF-8, not JSON, nested too deep, wrong structure, a version that
  is not an integer, larger than :data:`MAX_BYTES`): moved to ``<file>.corrupt-<stamp>-<pid>``; the
  cache starts empty;
- *damaged* (malformed entries, duplicate keys): copied to ``<file>.corrupt-<stamp>-<pid>``, then
  rewritten with the good entries only;
- *unusable* (a directory, FIFO, device or socket; a symbolic-link loop; permission denied): left
  alone, never opened for reading if not a regular file, never written over; the cache works in
  memory for the process.

Every case warns once per process with a :class:`TuningCacheWarning` naming the file. Setting aside
and rewriting happen under the lock after reading the file again, so a good file written meanwhile
by another process is never moved aside; when the lock cannot be taken quickly (a read-only
directory, a busy writer) the file is only ignored, and the next writer deals with it.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import stat
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import TuningCacheWarning
from ..fileio import write_atomic
from .cache_schema import FORMAT, VERSION, Parsed, parse

#: largest cache file read; a larger one is corrupt (moved aside).
MAX_BYTES = 64 << 20
#: how long a reader waits for the lock to set a damaged file aside before just ignoring it.
REPAIR_WAIT_S = 2.0
_tmp_counter = itertools.count()
_warned: set[str] = set()
_warned_lock = threading.Lock()

MISSING, OK, DAMAGED, CORRUPT, UNUSABLE = "missing", "ok", "damaged", "corrupt", "unusable"


def warn(message: str) -> None:
    warnings.warn(message, TuningCacheWarning, stacklevel=3)


def warn_once(key: str, message: str) -> None:
    """Warn unless a warning with the same ``key`` was already given in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, TuningCacheWarning, stacklevel=3)


@dataclass
class Loaded:
    """The outcome of reading a cache file: its good ``entries`` and ``state`` (``missing``, ``ok``,
    ``damaged``: some entries were bad, ``corrupt``: nothing usable, ``unusable``: not a regular
    readable file, must not be written over) with ``why`` and where a copy was set ``aside``."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: str = MISSING
    why: str = ""
    aside: str | None = None

    @property
    def writable(self) -> bool:
        """Whether a writer may replace the file (it is missing, or a regular file we could read)."""
        return self.state != UNUSABLE


def real_path(path: str) -> str:
    """Where writes go: the target of a symbolic link at ``path`` (the link is kept), else ``path``."""
    try:
        return os.path.realpath(path) if os.path.islink(path) else path
    except (OSError, ValueError):
        return path


def read_bytes(path: str) -> tuple[bytes | None, str, str]:
    """``(data, state, why)``: the file's bytes with state ``ok``; ``missing``; ``unusable`` for a
    file that is not a regular readable file (never opened when it is not regular, so a FIFO or a
    device cannot block or be disturbed); ``corrupt`` for one larger than :data:`MAX_BYTES`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, MISSING, ""
    except (OSError, ValueError) as exc:
        return None, UNUSABLE, _os_reason(exc)
    if not stat.S_ISREG(st.st_mode):
        return None, UNUSABLE, f"it is {_kind(st.st_mode)}, not a regular file"
    if st.st_size > MAX_BYTES:
        return None, CORRUPT, f"{st.st_size} bytes, more than the {MAX_BYTES} a cache may have"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, MISSING, ""
    except OSError as exc:
        return None, UNUSABLE, _os_reason(exc)
    try:
        st = os.fstat(fd)  # the path may have been replaced since the stat above
        if not stat.S_ISREG(st.st_mode):
            return None, UNUSABLE, f"it is {_kind(st.st_mode)}, not a regular file"
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return None, UNUSABLE, _os_reason(exc)
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        return None, CORRUPT, f"more than the {MAX_BYTES} bytes a cache may have"
    return b"".join(chunks), OK, ""


def load(path: str, *, handle_corrupt: bool = True, locked: bool = False) -> Loaded:
    """Read the cache file at ``path`` (see the module docstring for what happens to bad files).

    :param handle_corrupt: set damaged and corrupt files aside (False: only report them).
    :param locked: the caller holds the cache's lock (writers); otherwise the lock is taken, for at
        most :data:`REPAIR_WAIT_S`, only when something has to be set aside.
    """
    raw, state, why = read_bytes(path)
    if state == UNUSABLE:
        warn_once(f"unusable:{path}:{why}", f"tuning cache {path} cannot be read ({why}); it is left "
                                            f"alone and not used")
        return Loaded(state=UNUSABLE, why=why)
    if state == MISSING:
        return Loaded()
    parsed = parse(raw) if raw is not None else Parsed(problem=why)
    if parsed.problem is None and not parsed.damaged:
        _warn_newer(path, parsed)
        return Loaded(parsed.entries, OK)
    if not handle_corrupt:
        return _outcome(parsed, None)
    if locked:
        return _set_aside(path, raw, parsed)
    from ..errors import CacheError
    from .locking import FileLock

    try:
        with FileLock(path + ".lock", timeout_s=REPAIR_WAIT_S):
            raw2, state2, why2 = read_bytes(path)
            if state2 == MISSING:
                return Loaded()
            if state2 == UNUSABLE:
                return load(path, handle_corrupt=False)
            if raw2 != raw:  # another process changed it meanwhile: judge the new contents
                raw, parsed = raw2, parse(raw2) if raw2 is not None else Parsed(problem=why2)
                if parsed.problem is None and not parsed.damaged:
                    return Loaded(parsed.entries, OK)
            return _set_aside(path, raw, parsed)
    except (CacheError, OSError) as exc:
        what = parsed.problem or _damage(parsed)
        warn_once(f"nolock:{path}:{what}", f"tuning cache {path} is unusable ({what}) and was not set "
                                           f"aside (could not lock it: {exc}); its bad parts are ignored")
        return _outcome(parsed, None)


def read_entries(path: str, *, handle_corrupt: bool = True) -> tuple[dict[str, dict[str, Any]], bool]:
    """``(entries, bad)``: the good entries of the file at ``path`` and whether anything in it was
    not usable (see :func:`load`)."""
    loaded = load(path, handle_corrupt=handle_corrupt)
    return loaded.entries, loaded.state in (DAMAGED, CORRUPT, UNUSABLE)


def _outcome(parsed: Parsed, aside: str | None) -> Loaded:
    if parsed.problem is not None:
        return Loaded({}, CORRUPT, parsed.problem, aside)
    return Loaded(parsed.entries, DAMAGED, _damage(parsed), aside)


def _set_aside(path: str, raw: bytes | None, parsed: Parsed) -> Loaded:
    """Under the lock: move a corrupt file aside, or copy a damaged one aside and rewrite it clean."""
    if parsed.problem is not None:
        return _outcome(parsed, move_aside(path, parsed.problem))
    why = _damage(parsed)
    aside = move_aside(path, why, copy=True, data=raw)
    if aside is not None:
        try:
            write_entries(path, parsed.entries)
        except (OSError, ValueError) as exc:
            warn(f"could not rewrite the tuning cache {path} without its bad entries ({exc})")
    return _outcome(parsed, aside)


def _damage(parsed: Parsed) -> str:
    parts = []
    if parsed.bad:
        n = len(parsed.bad)
        parts.append(f"{n} malformed entr{'y' if n == 1 else 'ies'} "
                     f"({'; '.join(parsed.bad[:3])}{' ...' if n > 3 else ''})")
    if parsed.duplicates:
        parts.append(f"{parsed.duplicates} duplicate key{'s' if parsed.duplicates > 1 else ''}")
    return ", ".join(parts)


def _warn_newer(path: str, parsed: Parsed) -> None:
    if parsed.version > VERSION:
        warn_once(f"newer:{path}", f"tuning cache {path} was written by a newer Tracea (format version "
                                   f"{parsed.version}); reading the entries this version understands")


def move_aside(path: str, why: str, *, copy: bool = False, data: bytes | None = None) -> str | None:
    """Move (or copy) a bad cache file to ``<path>.corrupt-<timestamp>-<pid>`` and warn; returns the
    new path (None when that failed: the file is then only ignored). ``data``: the bytes to copy
    (default: read the file). A symbolic link is left in place; the file it points to is moved."""
    src = real_path(path)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    base = f"{path}.corrupt-{stamp}-{os.getpid()}"
    target = base
    while os.path.lexists(target):
        target = f"{base}-{next(_tmp_counter)}"
    try:
        if copy:
            if data is None:
                with open(src, "rb") as f:
                    data = f.read(MAX_BYTES + 1)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
            with os.fdopen(fd, "wb") as dst:
                dst.write(data)
        else:
            os.replace(src, target)
    except OSError as exc:
        warn_once(f"aside:{path}:{why}", f"tuning cache {path} is unusable ({why}) and could not be set "
                                         f"aside ({exc}); it is ignored")
        return None
    verb = "copied" if copy else "moved"
    warn(f"tuning cache {path} is unusable ({why}); {verb} it to {target} and continuing "
         f"{'without the bad entries' if copy else 'with an empty cache'}")
    return target


def write_entries(path: str, entries: dict[str, dict[str, Any]]) -> None:
    """Atomically replace the file at ``path`` (the target of a link there) with ``entries``.

    Raises OSError on failure, and refuses (OSError EEXIST) to replace something that is not a
    regular file: a directory, FIFO or device at the cache path is the user's, not the cache's."""
    path = real_path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} is {_kind(st.st_mode)}, not a regular file; not replacing it")
    # one entry per line, each encoded compactly: JSON's C encoder (an ``indent`` takes the pure-Python
    # one, ~3x slower on a few hundred entries, and the file is rewritten on every put)
    dumps = json.dumps
    lines = ",\n".join(f"  {dumps(k)}: {dumps(v, separators=(',', ':'))}" for k, v in sorted(entries.items()))
    head = f'{{"format": {dumps(FORMAT)}, "version": {dumps(VERSION)}, "entries": {{'
    write_atomic(path, head + ("\n" + lines + "\n}}\n" if lines else "}}\n"))


def file_state(path: str) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of ``path`` or None when missing: a cheap change detector."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    return str(exc)
