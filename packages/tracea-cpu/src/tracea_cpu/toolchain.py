"""The system C compiler: discovery, compilation of emitted sources into shared objects, an on-disk
cache keyed by source + flags + compiler identity, and loading through ctypes.

Compiler: ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on PATH. Cache directory:
``$TRACEA_CPU_CACHE_DIR``, else ``~/.cache/tracea/cpu``. Objects are written to a temporary name and
renamed into place, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from tracea.errors import BackendError, CompilationError
from tracea.fileio import publish
from tracea.paths import user_cache_dir

from .omp_env import apply_spin_default

BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
              "-Wall", "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-but-set-variable")
OPENMP_FLAG = "-fopenmp"
T = TypeVar("T")


@dataclass(frozen=True)
class Compiler:
    """A usable C compiler: its path, ``--version`` first line, and whether it accepts ``-fopenmp``."""

    path: str
    version: str
    openmp: bool

    def identity(self) -> str:
        return f"{self.path}|{self.version}|omp={int(self.openmp)}"


class CompilerMissing(Exception):
    """No working C compiler; the message says what was tried."""


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$TRACEA_CPU_CACHE_DIR``, else ``cpu`` in the user cache folder
    (:func:`tracea.paths.user_cache_dir`: ``$XDG_CACHE_HOME/tracea/cpu`` or ``~/.cache/tracea/cpu``)."""
    return user_cache_dir("cpu", env="TRACEA_CPU_CACHE_DIR")


def _candidates() -> list[str]:
    cc = os.environ.get("CC")
    if cc:
        return [cc]
    return ["cc", "gcc", "clang"]


@functools.lru_cache(maxsize=8)
def _probe(candidates: tuple[str, ...]) -> Compiler | str:
    tried = []
    for name in candidates:
        path = shutil.which(name)
        if path is None:
            tried.append(f"{name}: not found")
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{name}: {exc}")
            continue
        if out.returncode != 0:
            tried.append(f"{name}: --version exited {out.returncode}")
            continue
        version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else name
        return Compiler(path=path, version=version, openmp=_accepts_openmp(path))
    return "no C compiler found (" + "; ".join(tried) + "); install gcc or clang, or set $CC"


def _accepts_openmp(path: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.c"
        src.write_text("#include <omp.h>\nint tr_probe(void){return omp_get_max_threads();}\n")
        try:
            res = subprocess.run([path, OPENMP_FLAG, "-fPIC", "-shared", str(src), "-o", str(Path(tmp) / "o.so")],
                                 capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        return res.returncode == 0


def find_compiler() -> Compiler:
    """The compiler to use, or raise :class:`CompilerMissing` with every candidate's failure."""
    found = _probe(tuple(_candidates()))
    if isinstance(found, str):
        raise CompilerMissing(found)
    return found


def compiler_or_reason() -> tuple[Compiler | None, str]:
    try:
        return find_compiler(), ""
    except CompilerMissing as exc:
        return None, str(exc)


_load_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # digest -> what its loader returned
_building: dict[str, threading.Lock] = {}  # one per object being compiled: different objects compile at once


def build(source: str, flags: tuple[str, ...], name: str = "kernel") -> ctypes.CDLL:
    """Compile ``source`` with ``flags`` (plus the base flags and OpenMP when available) and load it.

    The object is cached on disk under a hash of source, flags and compiler identity.
    :raises CompilationError: the compiler failed; ``log`` holds its output.
    :raises BackendError: no compiler, or the object cannot be loaded.
    """
    def load(target: Path) -> ctypes.CDLL:
        apply_spin_default()  # before the first kernel loads libgomp (see omp_env)
        try:
            return ctypes.CDLL(str(target))
        except OSError as exc:
            raise BackendError(f"cannot load compiled kernel {target}: {exc}", backend="cpu") from None

    return build_with(source, flags, name, load)


def build_with(source: str, flags: tuple[str, ...], name: str, load: Callable[[Path], T],
               openmp: bool = True) -> T:
    """:func:`build` with another loader: compile ``source`` (disk-cached; OpenMP added when ``openmp``
    and the compiler has it) and return ``load(path)`` of the shared object, memoised per object (a
    Python extension module, for example)."""
    try:
        cc = find_compiler()
    except CompilerMissing as exc:
        raise BackendError(str(exc), backend="cpu") from None
    all_flags = BASE_FLAGS + tuple(flags) + ((OPENMP_FLAG,) if openmp and cc.openmp else ())
    digest = hashlib.sha256("\0".join((source, " ".join(all_flags), cc.identity())).encode()).hexdigest()[:24]
    with _load_lock:
        lib = _loaded.get(digest)
        if lib is not None:
            return lib  # type: ignore[no-any-return]
        building = _building.setdefault(digest, threading.Lock())
    with building:  # (threads building other objects compile meanwhile: the compiler runs outside the GIL)
        with _load_lock:
            lib = _loaded.get(digest)
            if lib is not None:
                return lib  # type: ignore[no-any-return]
        directory = cache_dir()
        target = directory / f"{name}-{digest}.so"
        if not target.exists():
            _compile(cc, source, all_flags, directory, target)
        with _load_lock:
            lib = load(target)
            _loaded[digest] = lib
            _building.pop(digest, None)
        return lib  # type: ignore[no-any-return]


def _compile(cc: Compiler, source: str, flags: tuple[str, ...], directory: Path, target: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendError(f"cannot create kernel cache directory {directory}: {exc}", backend="cpu") from None
    fd, tmp_so = tempfile.mkstemp(prefix=target.stem + ".", suffix=".so.tmp", dir=directory)
    os.close(fd)
    src_path = Path(tmp_so[: -len(".so.tmp")] + ".c")
    try:
        src_path.write_text(source)
        cmd = [cc.path, *flags, str(src_path), "-o", tmp_so, "-lm"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            raise CompilationError(f"running the C compiler failed: {exc}", backend="cpu",
                                   log=" ".join(cmd)) from None
        if res.returncode != 0:
            raise CompilationError(f"C compiler exited with status {res.returncode} building {target.name}",
                                   backend="cpu", log=" ".join(cmd) + "\n" + res.stdout + res.stderr)
        publish(tmp_so, target)
    finally:
        for leftover in (tmp_so, str(src_path)):
            try:
                os.unlink(leftover)
            except OSError:
                pass
