"""The cache's inter-process lock (tracea.tuning.locking, on the filelock package): exclusive across
processes and across lock objects, a timeout becomes CacheError, the folder is created, and the
O_EXCL fallback for file systems without flock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import filelock
import pytest

from tracea.errors import CacheError
from tracea.tuning.locking import FileLock


def test_second_holder_times_out_with_cache_error(tmp_path):
    path = str(tmp_path / "sub" / "dir" / "cache.json.lock")  # folder created on demand
    with FileLock(path):
        t0 = time.monotonic()
        with pytest.raises(CacheError, match="timed out .* waiting for the lock"):
            with FileLock(path, timeout_s=0.2):
                pass
        assert time.monotonic() - t0 >= 0.15
    with FileLock(path, timeout_s=0.2):  # released: free again
        pass


def test_lock_excludes_another_process_and_dies_with_it(tmp_path):
    path = str(tmp_path / "c.lock")
    code = textwrap.dedent(f"""
        import sys, time
        from tracea.tuning.locking import FileLock
        lock = FileLock({path!r}); lock.acquire()
        print("held", flush=True); sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(CacheError):
            FileLock(path, timeout_s=0.2).acquire()
    finally:
        child.kill()  # dies holding the lock: the kernel frees it, no stale lock remains
        child.wait()
    with FileLock(path, timeout_s=5):
        pass


def test_file_system_without_flock_uses_an_exclusive_lock_file(tmp_path, monkeypatch):
    class NoFlock(filelock.FileLock):  # what filelock 3.x raises where flock is ENOSYS
        def acquire(self, *a, **k):
            raise NotImplementedError("FileSystem does not appear to support flock")

    monkeypatch.setattr(filelock, "FileLock", NoFlock)
    path = str(tmp_path / "c.lock")
    with FileLock(path):
        assert (tmp_path / "c.lock.excl").exists()
        with pytest.raises(CacheError):
            FileLock(path, timeout_s=0.1).acquire()
    assert not (tmp_path / "c.lock.excl").exists()
