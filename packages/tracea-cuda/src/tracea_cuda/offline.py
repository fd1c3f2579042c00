"""Offline compilation of emitted kernels with ``nvcc`` (no GPU needed): used by CI to compile every
hero configuration for sm_80 and sm_90a and to read ptxas' resource report (registers, spills,
static shared memory)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from tracea.errors import CompilationError

GENCODE = {"sm_80": "-gencode=arch=compute_80,code=sm_80", "sm_90a": "-gencode=arch=compute_90a,code=sm_90a"}


@dataclass(frozen=True)
class Resources:
    """ptxas' report for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int
    advisories: tuple[str, ...] = ()  # ptxas performance advisories (C7514 wgmma serialisation, C7508 ...)


def nvcc_path() -> str | None:
    return os.environ.get("TRACEA_NVCC") or shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def compile_report(source: str, arch: str, nvcc: str | None = None, timeout: float = 600) -> dict[str, Resources]:
    """Compile ``source`` to a cubin for ``arch`` and return ptxas' resources by kernel name."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise CompilationError("nvcc not found", backend="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", GENCODE[arch], "-std=c++17", "-Xptxas", "-v", "-o", os.path.join(tmp, "k.cubin"), src]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise CompilationError(f"nvcc failed for {arch}", backend="cuda", log=log)
    return parse_ptxas(log)


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


_ADVISORY = re.compile(r"\((C75\d\d)\)[^']*in the function '(\w+)'")


def parse_ptxas(log: str) -> dict[str, Resources]:
    out: dict[str, Resources] = {}
    advice: dict[str, list[str]] = {}
    for m in _ADVISORY.finditer(log):
        advice.setdefault(m.group(2), []).append(m.group(1))
    current = None
    frame = (0, 0, 0)
    for line in log.splitlines():
        m = _ENTRY.search(line)  # type: ignore[assignment]
        if m:
            current, frame = m.group(1), (0, 0, 0)
            continue
        m = _FRAME.search(line)
        if m and current:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = _USED.search(line)
        if m and current:
            out[current] = Resources(int(m.group(1)), frame[1], frame[2], frame[0], int(m.group(2) or 0))
            current = None
    for name, codes in advice.items():
        if name in out:
            r = out[name]
            out[name] = Resources(r.registers, r.spill_stores, r.spill_loads, r.stack, r.static_smem, tuple(codes))
    return out


def bundle(sources: dict[str, str]) -> str:
    """One translation unit holding several rendered kernels (each in its own namespace)."""
    parts = [f"namespace {name}_ns {{\n{src}\n}}\n" for name, src in sources.items()]
    return "\n".join(parts)
