"""Build and cache OpenCL programs.

Programs are cached in memory per (context, device, source, build options). pyopencl's own binary cache
(``~/.cache/pyopencl`` or ``$PYOPENCL_CACHE_DIR``) keeps built binaries on disk across processes for
platforms that can return program binaries, keyed by device, source and options; set
``PYOPENCL_NO_CACHE=1`` to disable it. Build failures raise :class:`~tracea.errors.CompilationError`
carrying the OpenCL build log.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections import OrderedDict
from typing import Any

from tracea.errors import CompilationError

from . import runtime

#: Options every program is built with: fp32 semantics stay IEEE (no -cl-fast-relaxed-math), but FMA
#: contraction and no-signed-zero handling are allowed.
BUILD_OPTIONS = ("-cl-mad-enable", "-cl-no-signed-zeros")

#: Programs kept in memory (least recently used dropped first); a tuner sweep builds hundreds.
MAX_PROGRAMS = 1024
_cache: "OrderedDict[tuple[int, int, str, tuple[str, ...]], Any]" = OrderedDict()
_lock = threading.Lock()
_stats = {"hits": 0, "builds": 0}


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def build(context: Any, device: Any, source: str, options: tuple[str, ...] = BUILD_OPTIONS) -> Any:
    """A built ``pyopencl.Program`` for ``source`` on ``device`` of ``context`` (cached).

    :raises CompilationError: when the OpenCL compiler rejects the source (``log`` holds its output).
    """
    key = (context.int_ptr, device.int_ptr, source_hash(source), tuple(options))
    with _lock:
        prg = _cache.get(key)
        if prg is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return prg
    pcl = runtime.cl()
    program = pcl.Program(context, source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Intel CPU compiler prints remarks for every build
            program = program.build(options=list(options), devices=[device])
    except pcl.Error as exc:
        log = _build_log(program, device) or str(exc)
        raise CompilationError(f"OpenCL build failed on {device.name} ({device.platform.name})",
                               backend="opencl", log=log) from exc
    with _lock:
        _cache[key] = program
        while len(_cache) > MAX_PROGRAMS:
            _cache.popitem(last=False)
        _stats["builds"] += 1
    return program


def _build_log(program: Any, device: Any) -> str:
    pcl = runtime.cl()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "pre-build attribute access" warning: irrelevant after a failure
            return str(program.get_build_info(device, pcl.program_build_info.LOG)).strip()
    except Exception:  # the failed build may have left no log object
        return ""


def stats() -> dict[str, int]:
    """In-memory cache counters (hits, builds) and the number of cached programs."""
    with _lock:
        return {**_stats, "programs": len(_cache)}


def clear() -> None:
    """Drop the in-memory program cache (pyopencl's disk cache stays)."""
    with _lock:
        _cache.clear()
