"""Files that other processes may read while they are written: one helper, used by the tuning cache and
the backends' compiled-kernel caches.

:func:`write_atomic` writes a temporary file ``<path>.tmp-<pid>-<n>`` in the target's folder, flushes
and ``fsync``\\ s it, and ``os.replace``\\ s it over ``path`` (then ``fsync``\\ s the folder where POSIX
allows), so a reader sees the old file or the new one, never a torn one, even after a power loss; the
temporary file is removed on any failure. :func:`publish` does the same for a file another tool (a C
compiler) has already written.
"""

from __future__ import annotations

import itertools
import os

_counter = itertools.count()


def temp_path(path: str | os.PathLike[str]) -> str:
    """A fresh temporary name beside ``path`` (``<path>.tmp-<pid>-<n>``)."""
    return f"{os.fspath(path)}.tmp-{os.getpid()}-{next(_counter)}"


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # Windows, or a folder we may not open: the rename itself is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8") -> None:
    """Replace the file at ``path`` with ``data`` atomically and durably (parent folders are created).
    Raises OSError on failure, leaving the old file and no temporary file behind."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = temp_path(path)
    raw = data.encode(encoding) if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(directory)


def publish(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """``fsync`` the finished file ``tmp`` and move it over ``path`` atomically."""
    tmp, path = os.fspath(tmp), os.fspath(path)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
