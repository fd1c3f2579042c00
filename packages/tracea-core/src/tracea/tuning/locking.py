"""The inter-process lock held while a cache file is merged and replaced (read-merge-write), on a side
file ``<cache>.lock``: the `filelock <https://py-filelock.readthedocs.io>`_ package's ``FileLock``
(``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows; the kernel releases it when a process dies,
so a crashed writer never leaves a stale lock behind).

Tracea's contract on top of it: the lock's folder is created first; a wait longer than ``timeout_s``
raises :class:`~tracea.errors.CacheError` naming the lock file (callers keep results in memory and
warn); and on a file system without ``flock`` (some network file systems, where filelock 3.x raises
``NotImplementedError``) an ``O_EXCL`` ``SoftFileLock`` on ``<cache>.lock.excl`` is used instead.
Waits are short: the lock is held only while one file is rewritten.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import filelock

from ..errors import CacheError


class FileLock:
    """Context manager holding an exclusive lock on ``path`` (created if missing)."""

    def __init__(self, path: str, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._lock: Any = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        lock: Any = filelock.FileLock(self.path, timeout=self.timeout_s)
        try:
            try:
                lock.acquire()
            except NotImplementedError:  # no flock on this file system: a lock file created with O_EXCL
                lock = filelock.SoftFileLock(self.path + ".excl", timeout=self.timeout_s)
                lock.acquire()
        except filelock.Timeout as exc:
            raise CacheError(f"timed out after {self.timeout_s:.0f} s waiting for the lock {exc.lock_file} "
                             f"(held by another Tracea process?)") from exc
        self._lock = lock

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
