"""An inter-process exclusive lock on a side file (``<cache>.lock``) for read-merge-write updates.

``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows; where neither works (some network file
systems) an ``O_EXCL`` lock file with stale-lock expiry. The lock is held only while a cache file is
merged and replaced, so waits are short; ``timeout_s`` bounds them.
"""

from __future__ import annotations

import errno
import os
import time
from types import TracebackType

from ..errors import CacheError

try:  # pragma: no cover - platform dependent
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]
try:  # pragma: no cover
    import msvcrt
except ImportError:  # pragma: no cover
    msvcrt = None  # type: ignore[assignment]

STALE_S = 60.0
_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP}


class FileLock:
    """Context manager holding an exclusive lock on ``path`` (created if missing)."""

    def __init__(self, path: str, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._fd: int | None = None
        self._excl = False

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if fcntl is not None or msvcrt is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                while True:
                    try:
                        if fcntl is not None:
                            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        else:  # pragma: no cover - Windows
                            os.lseek(fd, 0, os.SEEK_SET)
                            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                        self._fd = fd
                        return
                    except OSError as exc:
                        if exc.errno in _UNSUPPORTED:
                            break  # this file system cannot lock: fall back to an O_EXCL lock file
                        if time.monotonic() > deadline:
                            raise CacheError(f"timed out after {self.timeout_s:.0f} s waiting for the lock "
                                             f"{self.path} (held by another Tracea process?)") from exc
                        time.sleep(0.01)
            except BaseException:
                if self._fd is None:
                    os.close(fd)
                raise
            os.close(fd)
        self._acquire_excl(deadline)

    def _acquire_excl(self, deadline: float) -> None:
        path = self.path + ".excl"
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                self._excl = True
                return
            except FileExistsError:
                try:
                    if time.time() - os.stat(path).st_mtime > STALE_S:
                        os.unlink(path)
                        continue
                except OSError:
                    continue
                if time.monotonic() > deadline:
                    raise CacheError(f"timed out waiting for the lock file {path}; delete it if no "
                                     f"Tracea process is running") from None
                time.sleep(0.01)

    def release(self) -> None:
        if self._fd is not None:
            try:
                if fcntl is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                elif msvcrt is not None:  # pragma: no cover
                    os.lseek(self._fd, 0, os.SEEK_SET)
                    msvcrt.locking(self._fd, msvcrt.LK_UNLCK, 1)
            finally:
                os.close(self._fd)
                self._fd = None
        if self._excl:
            try:
                os.unlink(self.path + ".excl")
            except OSError:
                pass
            self._excl = False

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
