"""tracea.fileio (atomic, durable writes) and tracea.paths (the user cache folder via platformdirs)."""

from __future__ import annotations

import os

import pytest

from tracea import fileio, paths


def test_write_atomic_replaces_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "a" / "b" / "file.bin"
    fileio.write_atomic(target, b"one")
    fileio.write_atomic(target, "two\n")
    assert target.read_bytes() == b"two\n"
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "file.json"
    target.write_text("old")

    def broken_fsync(fd):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        fileio.write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]


def test_publish_moves_a_finished_file(tmp_path):
    tmp = tmp_path / "x.so.tmp"
    tmp.write_bytes(b"\x7fELF")
    fileio.publish(tmp, tmp_path / "x.so")
    assert not tmp.exists() and (tmp_path / "x.so").read_bytes() == b"\x7fELF"


def test_user_cache_dir_honours_xdg_and_the_override(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRACEA_X_CACHE_DIR", raising=False)
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert paths.user_cache_dir("cuda", env="TRACEA_X_CACHE_DIR") == tmp_path / "xdg" / "tracea" / "cuda"
    monkeypatch.setenv("TRACEA_X_CACHE_DIR", "~/elsewhere")
    assert paths.user_cache_dir("cuda", env="TRACEA_X_CACHE_DIR") == paths.Path("~/elsewhere").expanduser()


def test_backends_use_the_shared_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TRACEA_CPU_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRACEA_CUDA_CACHE_DIR", raising=False)
    cpu = pytest.importorskip("tracea_cpu.toolchain")
    assert cpu.cache_dir() == paths.user_cache_dir("cpu")
    cuda = pytest.importorskip("tracea_cuda.compiler")
    assert cuda.cache_dir() == paths.user_cache_dir("cuda")
