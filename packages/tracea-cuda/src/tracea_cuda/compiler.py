"""NVRTC compilation through CuPy with an in-memory and an on-disk module cache.

The disk cache key hashes the source, the options, the target architecture and the CuPy and NVRTC
versions, so a second process loads the cubin without compiling. Files are written atomically
(:func:`tracea.fileio.write_atomic`: temporary file, fsync, ``os.replace``); a corrupt or unreadable entry is recompiled, never fatal.

Environment: ``TRACEA_CUDA_CACHE_DIR`` (default ``cuda`` in the user cache folder,
:func:`tracea.paths.user_cache_dir`: ``$XDG_CACHE_HOME/tracea/cuda`` or ``~/.cache/tracea/cuda``); ``TRACEA_CUDA_NO_DISK_CACHE=1`` disables the disk cache;
``TRACEA_CUDA_KEEP_SOURCE=1`` writes the ``.cu`` beside each cubin for inspection.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from tracea.errors import CompilationError, LaunchError
from tracea.fileio import write_atomic
from tracea.paths import user_cache_dir

from . import toolkit

_LOCK = threading.Lock()
_MEMORY: dict[str, Any] = {}
STATS = {"compiled": 0, "disk_hits": 0, "memory_hits": 0}


def cache_dir() -> Path:
    """``$TRACEA_CUDA_CACHE_DIR``, else ``cuda`` in the user cache folder (:func:`tracea.paths.user_cache_dir`)."""
    return user_cache_dir("cuda", env="TRACEA_CUDA_CACHE_DIR")


def options_for(arch: str) -> tuple[str, ...]:
    return (f"-arch={arch}", "-std=c++17", "--device-as-default-execution-space")


def cache_key(source: str, options: tuple[str, ...], arch: str) -> str:
    v = toolkit.versions()
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch, v.get("cupy", ""), v.get("nvrtc", "")):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


def _nvrtc_cubin(source: str, options: tuple[str, ...], name: str) -> bytes:
    from cupy.cuda import nvrtc  # noqa: PLC0415

    prog = nvrtc.createProgram(source, name + ".cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as exc:
            log = ""
            try:
                log = nvrtc.getProgramLog(prog)
            except Exception:
                pass
            raise CompilationError(f"NVRTC failed to compile {name} ({exc})", backend="cuda",
                                   log=log + "\n--- options ---\n" + " ".join(options)) from None
        if hasattr(nvrtc, "getCUBIN"):
            return bytes(nvrtc.getCUBIN(prog))
        ptx = nvrtc.getPTX(prog)  # older CuPy: let the driver assemble the PTX
        return ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    finally:
        try:
            nvrtc.destroyProgram(prog)
        except Exception:
            pass


def precompile(source: str, name: str, arch: str) -> bool:
    """Compile ``source`` for ``arch`` into the disk cache that :func:`load` reads, unless it is there
    already; NVRTC only, so a process without a CUDA context (a worker of a probe's compile pool) can
    fill the cache. True when it compiled, False on a cache hit."""
    options = options_for(arch)
    path = cache_dir() / f"{cache_key(source, options, arch)}.cubin"
    if path.is_file():
        return False
    write_atomic(path, _nvrtc_cubin(source, options, name))
    return True


class Kernel:
    """A loaded kernel function plus its launch shape facts."""

    def __init__(self, function: Any, key: str, smem: int, threads: int) -> None:
        self.function = function
        self.key = key
        self.smem = smem
        self.threads = threads
        if smem > 48 * 1024:
            try:
                drv = toolkit.cupy().cuda.driver
                attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
                drv.funcSetAttribute(function.ptr, attr, smem)
            except Exception as exc:
                raise LaunchError(f"cannot raise dynamic shared memory to {smem} B ({exc})", backend="cuda") from None

    def launch(self, grid: tuple[int, int, int], args: tuple, stream: Any) -> None:
        try:
            self.function(grid, (self.threads, 1, 1), args, shared_mem=self.smem, stream=stream)
        except Exception as exc:
            raise LaunchError(f"launch of {self.key} failed: {type(exc).__name__}: {exc}", backend="cuda") from None


def load(source: str, name: str, arch: str, *, smem: int, threads: int) -> Kernel:
    """Compile (or fetch from cache) ``source`` for ``arch`` and return kernel ``name`` ready to launch."""
    options = options_for(arch)
    key = cache_key(source, options, arch)
    # one cubin holds every entry point of the source; the loaded function is per name
    mem_key = f"{key}:{name}:{toolkit.cupy().cuda.runtime.getDevice()}"
    with _LOCK:
        hit = _MEMORY.get(mem_key)
    if hit is not None:
        STATS["memory_hits"] += 1
        return hit
    cp = toolkit.cupy()
    from .launcher import CaptureRefused, capturing_now  # noqa: PLC0415

    if capturing_now():  # loading a module inside a capture would invalidate it: refuse first
        raise CaptureRefused(f"kernel {name} is not loaded yet and a CUDA graph is capturing on the current stream; "
                             "run the call once before capturing", backend="cuda")
    use_disk = os.environ.get("TRACEA_CUDA_NO_DISK_CACHE", "") not in ("1", "true", "yes")
    path = cache_dir() / f"{key}.cubin"
    cubin = None
    if use_disk and path.is_file():
        try:
            cubin = path.read_bytes()
            STATS["disk_hits"] += 1
        except OSError:
            cubin = None
    if cubin is None:
        cubin = _nvrtc_cubin(source, options, name)
        STATS["compiled"] += 1
        if use_disk:
            try:
                write_atomic(path, cubin)
                if os.environ.get("TRACEA_CUDA_KEEP_SOURCE") == "1":
                    write_atomic(path.with_suffix(".cu"), source.encode())
            except OSError:
                pass  # a read-only cache dir only costs recompiles
    try:
        module = cp.cuda.function.Module()
        module.load(cubin)
        function = module.get_function(name)
    except Exception as exc:
        if use_disk:
            try:
                path.unlink()
            except OSError:
                pass
        raise CompilationError(f"cannot load compiled module for {name}: {exc}", backend="cuda") from None
    kernel = Kernel(function, key, smem, threads)
    kernel.module = module  # type: ignore[attr-defined]  # keep the module alive with the function
    with _LOCK:
        # Two threads that missed at once (the arbiter's worker threads compile alternatives beside the
        # caller) each loaded a module: every caller gets the one kept here. Launchers hold raw function
        # handles, and a module only its caller held is unloaded once that Kernel is dropped -- its
        # launches then failed with CUDA_ERROR_INVALID_HANDLE (H100, the pre-pass kernel of a patched fp32 conv).
        return _MEMORY.setdefault(mem_key, kernel)
