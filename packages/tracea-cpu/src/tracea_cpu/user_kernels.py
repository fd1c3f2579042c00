"""Runner for user C kernels (``tracea.tune_kernel(..., lang="C")``), Kernel Tuner's convention.

The source is compiled as C++ (``$CXX``, else ``g++``, ``c++``, ``clang++``; ``compiler=`` picks
another) with ``-fPIC`` plus the user's ``compiler_options`` only, exactly like Kernel Tuner, and
wrapped in ``extern "C" { ... }`` unless it already says ``extern "C"``. The function returns its own
run time in milliseconds as a ``float``; that value is the measurement. Arrays are passed as pointers
to private copies (the caller's arrays are never written), NumPy scalars by value. Shared objects are
kept in ``$TRACEA_CPU_CACHE_DIR/user`` keyed by source, flags and compiler identity.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tracea.errors import CompilationError, InvalidArgumentError, LaunchError, UnsupportedDeviceError
from tracea.usertune.runner import Launch

from .toolchain import cache_dir

_SCALARS = {"int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
            "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
            "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool}


@functools.lru_cache(maxsize=8)
def find_cxx(preferred: str | None) -> tuple[str, str]:
    """(path, ``--version`` first line) of the C++ compiler to use; UnsupportedDeviceError when none."""
    names = [preferred] if preferred else ([os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"])
    for name in names:
        path = shutil.which(name)
        if path:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
                return path, (out.stdout.splitlines() or ["?"])[0].strip()
            except (OSError, subprocess.TimeoutExpired):
                continue
    raise UnsupportedDeviceError(f"no C++ compiler for C kernels (tried {', '.join(names)}); install g++ or set CXX")


class CRunner:
    """:class:`tracea.usertune.runner.KernelRunner` for C functions that return their time in ms."""

    lang = "C"
    max_threads = 1024
    returns_time = True

    def __init__(self, compiler: str | None = None) -> None:
        from tracea.doctor.doctor import get_doctor

        self.cxx, self.cxx_version = find_cxx(compiler)
        self.profile = get_doctor().profile_for("cpu")
        self.device_name = platform.processor() or self.profile.name
        self._libs: list[Any] = []

    def environment(self) -> dict[str, str]:
        return {"CC Version": self.cxx_version, "compiler": self.cxx}

    def prepare_arguments(self, arguments: Sequence[Any], inplace: bool = False) -> list[Any]:
        out = []
        for i, a in enumerate(arguments):
            if isinstance(a, np.ndarray):
                if a.dtype.hasobject:
                    raise InvalidArgumentError(f"arguments[{i}]", a, "a NumPy array of numbers")
                direct = inplace and a.flags.c_contiguous and a.flags.writeable
                out.append([a, a if direct else np.array(a, order="C", copy=True)])
            elif isinstance(a, np.generic):
                if a.dtype.name not in _SCALARS:
                    raise InvalidArgumentError(f"arguments[{i}]", a, f"a NumPy scalar of {', '.join(_SCALARS)}")
                out.append([a, a])  # type: ignore[list-item]
            else:
                raise InvalidArgumentError(f"arguments[{i}]", a, "a NumPy array or a NumPy scalar such as np.int32(n) "
                                                                 "(C kernels take pointers and typed values)")
        return out

    def compile(self, launch: Launch) -> Any:
        text = launch.source if 'extern "C"' in launch.source else 'extern "C" {\n' + launch.source + "\n}"
        flags = ("-fPIC",) + tuple(launch.compiler_options)
        digest = hashlib.sha256("\0".join((self.cxx, self.cxx_version, text) + flags).encode()).hexdigest()[:24]
        directory = cache_dir() / "user"
        target = directory / f"k_{digest}.so"
        if not target.exists():
            self._build(text, flags, directory, target)
        try:
            lib = ctypes.CDLL(str(target))
            fn = getattr(lib, launch.name)
        except (OSError, AttributeError) as exc:
            raise CompilationError(f"could not load {launch.name} from the compiled kernel: {exc}", backend="cpu") from None
        fn.restype = ctypes.c_float
        self._libs.append(lib)
        return fn

    def _build(self, text: str, flags: tuple[str, ...], directory: Path, target: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src = Path(tmp) / "kernel.cc"
            src.write_text(text, encoding="utf-8")
            obj = Path(tmp) / "kernel.o"
            so = Path(tmp) / "kernel.so"
            for cmd in ([self.cxx, "-c", str(src), *flags, "-o", str(obj)], [self.cxx, str(obj), *flags, "-shared", "-o", str(so)]):
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    raise CompilationError(f"{self.cxx} failed to run: {exc}", backend="cpu") from None
                if proc.returncode != 0:
                    raise CompilationError(f"{' '.join(cmd[:1] + list(flags))} failed", backend="cpu",
                                           log=(proc.stderr or proc.stdout)[-4000:])
            os.replace(so, target)

    def _cargs(self, args: list[Any]) -> list[Any]:
        return [ctypes.c_void_p(cur.ctypes.data) if isinstance(cur, np.ndarray) else _SCALARS[cur.dtype.name](cur.item())
                for _, cur in args]

    def reset_arguments(self, args: list[Any]) -> None:
        for orig, cur in args:
            if isinstance(cur, np.ndarray) and cur is not orig:
                cur[...] = orig

    def run(self, kernel: Any, args: list[Any], launch: Launch) -> float:
        ms = float(kernel(*self._cargs(args)))
        return ms

    def benchmark(self, kernel: Any, args: list[Any], launch: Launch, iterations: int) -> list[float]:
        cargs = self._cargs(args)
        kernel(*cargs)  # warm-up
        times = [float(kernel(*cargs)) for _ in range(iterations)]
        if not all(np.isfinite(t) and t >= 0 for t in times):
            raise LaunchError(f"the C function returned {times}; C kernels must return their run time in ms as a float",
                              backend="cpu")
        return times

    def results(self, args: list[Any], only: Sequence[int] | None = None) -> list[Any]:
        return [cur.copy() if isinstance(cur, np.ndarray) and (only is None or i in only) else
                (cur if not isinstance(cur, np.ndarray) else None) for i, (_, cur) in enumerate(args)]

    def copy_back(self, args: list[Any]) -> None:
        for orig, cur in args:
            if isinstance(cur, np.ndarray) and cur is not orig and orig.flags.writeable:
                orig[...] = cur

    def close(self) -> None:
        self._libs.clear()


def runner(lang: str, device: Any, options: dict[str, Any]) -> CRunner | None:
    """The ``tracea_kernel_runner`` answer for lang ``"C"``."""
    if lang != "C":
        return None
    return CRunner(options.get("compiler"))
