"""Host CPU capability probe: model, usable cores, SIMD ISA flags and cache sizes.

Linux reads ``/proc/cpuinfo`` and ``/sys/devices/system/cpu``; macOS asks ``sysctl``; elsewhere the
probe falls back to :mod:`platform`. Nothing here raises: unknown facts stay empty.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import dataclass, field

# ISA flags Tracea cares about, as Linux names them (NEON is 'asimd' on aarch64 Linux).
SIMD_FLAGS = ("sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
              "avx512vl", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
              "amx_fp16", "neon", "asimd",
              "sve", "sve2", "bf16", "i8mm")


@dataclass(frozen=True)
class CpuInfo:
    """What the probe found. ``simd`` is the subset of :data:`SIMD_FLAGS` present."""

    model: str
    vendor: str
    arch: str
    cores: int
    logical_cpus: int
    simd: tuple[str, ...]
    caches: dict[str, int] = field(default_factory=dict)
    mhz: float = 0.0
    family: int = 0

    @property
    def best_isa(self) -> str:
        """The widest vector ISA usable by the CPU backend: avx512, avx2, neon or scalar."""
        flags = set(self.simd)
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"} <= flags:
            return "avx512"
        if {"avx2", "fma"} <= flags:
            return "avx2"
        if "neon" in flags or "asimd" in flags:
            return "neon"
        return "scalar"

    @property
    def microarch(self) -> str:
        """The CPU family as far as kernel speed goes: ``<vendor>[-<generation>]-<best isa>``.

        ``intel-avx512`` (full-rate 512-bit FMAs), ``amd-zen4-avx512`` (512-bit ops on 256-bit pipes),
        ``amd-zen5-avx512`` (full rate), ``intel-avx2``, ``amd-avx2``, ``arm-neon``, ``x86_64-scalar`` ...
        Performance data and hero configs are keyed by it."""
        isa = self.best_isa
        vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(self.vendor, "")
        if not vendor:
            vendor = "apple" if self.vendor == "Apple" else ("arm" if isa == "neon" else (self.arch or "cpu"))
        if vendor == "amd" and isa == "avx512":
            return "amd-zen4-avx512" if self.family < 26 else "amd-zen5-avx512"
        return f"{vendor}-{isa}"

    @property
    def matrix_isa(self) -> str:
        """The CPU's matrix (tile) extension: ``"amx"`` (AMX-TILE with AMX-BF16) or ``""``."""
        return "amx" if {"amx_tile", "amx_bf16"} <= set(self.simd) else ""

    @property
    def isa_summary(self) -> str:
        """What ``tracea doctor`` prints as the best ISA: the vector ISA, plus AMX with its data
        types and whether the OS lets this process use tile data (e.g. ``avx512 + amx (bf16 int8;
        OS: tile data allowed)``)."""
        if not self.matrix_isa:
            return self.best_isa
        kinds = " ".join(k for k in ("bf16", "int8", "fp16") if f"amx_{k}" in self.simd)
        return f"{self.best_isa} + amx ({kinds}; OS: {amx_os_state()})"

    def peak_gflops_f32(self) -> float:
        """A rough fp32 FMA peak for estimates (2 FMA pipes x vector lanes x 2 flops x clock)."""
        lanes = {"avx512": 16, "avx2": 8, "neon": 4, "scalar": 1}[self.best_isa]
        if self.best_isa == "avx512" and self.vendor == "AuthenticAMD" and self.family < 26:
            lanes = 8  # Zen 4 executes 512-bit FMAs on 256-bit pipes (half rate); Zen 5 (family 26) is full width
        ghz = (self.mhz or 3000.0) / 1000.0
        return self.cores * 2 * lanes * 2 * ghz


def amx_os_state() -> str:
    """Whether Linux lets this process use AMX tile data (``arch_prctl`` ARCH_GET_XCOMP_SUPP / _PERM;
    asking for it is left to the backend that runs AMX code): ``tile data allowed``, ``tile data
    allowed on request``, ``kernel lacks AMX tile data support``, or ``unknown (...)``."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"unknown ({platform.system()} {platform.machine()})"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        supp, perm = ctypes.c_ulong(0), ctypes.c_ulong(0)
        if libc.syscall(158, 0x1021, ctypes.byref(supp)) != 0:
            return "unknown (kernel without arch_prctl XCOMP queries, older than 5.16)"
        libc.syscall(158, 0x1022, ctypes.byref(perm))
    except (OSError, AttributeError) as exc:
        return f"unknown ({exc})"
    if perm.value >> 18 & 1:
        return "tile data allowed"
    if supp.value >> 18 & 1:
        return "tile data allowed on request"
    return "kernel lacks AMX tile data support"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = 1
    for suffix, m in (("K", 1024), ("M", 1024**2), ("G", 1024**3)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
    try:
        return int(float(text) * mult)
    except ValueError:
        return 0


def _linux() -> tuple[str, str, set[str], float, int]:
    model = vendor = ""
    flags: set[str] = set()
    mhz = 0.0
    family = 0
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value
        elif key == "vendor_id" and not vendor:
            vendor = value
        elif key in ("flags", "features") and not flags:
            flags = set(value.lower().split())
        elif key == "cpu family" and not family and value.isdigit():
            family = int(value)
        elif key == "cpu mhz" and not mhz:
            try:
                mhz = float(value)
            except ValueError:
                pass
    if "asimd" in flags:
        flags.add("neon")
    return model, vendor, flags, mhz, family


def _linux_caches() -> dict[str, int]:
    caches: dict[str, int] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return caches
    for entry in entries:
        if not entry.startswith("index"):
            continue
        level = _read(f"{base}/{entry}/level").strip()
        kind = _read(f"{base}/{entry}/type").strip()
        size = _size(_read(f"{base}/{entry}/size"))
        if not level or not size or kind == "Instruction":
            continue
        name = f"L{level}d" if kind == "Data" else f"L{level}"
        caches[name] = size
    return caches


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _macos() -> tuple[str, str, set[str], dict[str, int]]:
    model = _sysctl("machdep.cpu.brand_string")
    flags = set((_sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")).lower().split())
    flags = {f.replace(".", "_") for f in flags}
    if platform.machine() == "arm64":
        flags |= {"neon", "asimd"}
    caches = {}
    for key, name in (("hw.l1dcachesize", "L1d"), ("hw.l2cachesize", "L2"), ("hw.l3cachesize", "L3")):
        v = _sysctl(key)
        if v.isdigit() and int(v):
            caches[name] = int(v)
    return model, "Apple" if "Apple" in model else "", flags, caches


def usable_cores() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def probe_cpu() -> CpuInfo:
    """Probe the host CPU once per process."""
    arch = platform.machine().lower() or "unknown"
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    caches: dict[str, int] = {}
    mhz = 0.0
    family = 0
    if os.path.exists("/proc/cpuinfo"):
        model, vendor, flags, mhz, family = _linux()
        caches = _linux_caches()
    elif platform.system() == "Darwin":
        model, vendor, flags, caches = _macos()
    else:
        model, vendor, flags = platform.processor(), "", set()
        if arch == "aarch64":
            flags = {"neon", "asimd"}
    simd = tuple(f for f in SIMD_FLAGS if f in flags)
    cores = usable_cores()
    return CpuInfo(model=model or platform.processor() or arch, vendor=vendor, arch=arch, cores=cores,
                   logical_cpus=os.cpu_count() or cores, simd=simd, caches=caches, mhz=mhz, family=family)
