"""CUDA device profiles from ``cudaGetDeviceProperties`` (through CuPy)."""

from __future__ import annotations

import os
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device

from . import toolkit

#: Dense Tensor Core FLOP per SM per clock for 16-bit inputs, by compute capability major.minor.
_TC_FLOPS_PER_CLK = {(8, 0): 2048, (8, 6): 1024, (8, 7): 1024, (8, 9): 1024, (9, 0): 4096}
_FP32_FLOPS_PER_CLK = {(8, 0): 128, (9, 0): 256}
_TC_GEN = {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}

# cudaDeviceAttr values (driver_types.h).
_ATTR_CLOCK_RATE = 13
_ATTR_MEMORY_CLOCK_RATE = 36
_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37


def _attr(rt: Any, attr: int, index: int) -> int:
    try:
        return int(rt.deviceGetAttribute(attr, index))
    except Exception:
        return 0


def isa_flags(cc: tuple[int, int]) -> tuple[str, ...]:
    """Capability flags the variants require (``mma_sync``, ``cp_async``, ``wgmma``, ``tma`` ...)."""
    flags = [f"sm_{cc[0]}{cc[1]}"]
    if cc >= (7, 0):
        flags.append("tensor_cores")
    if cc >= (8, 0):
        flags += ["mma_sync", "cp_async", "ldmatrix", "bf16", "tf32"]
    if cc == (9, 0):
        flags += ["sm_90a", "wgmma", "tma", "mbarrier", "setmaxnreg"]
    return tuple(flags)


def profile(index: int) -> DeviceProfile:
    """The :class:`DeviceProfile` of CUDA device ``index``."""
    cp = toolkit.cupy()
    rt = cp.cuda.runtime
    p = rt.getDeviceProperties(index)
    cc = (int(p["major"]), int(p["minor"]))
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    sms = int(p.get("multiProcessorCount", 1))
    clock_khz = _attr(rt, _ATTR_CLOCK_RATE, index) or int(p.get("clockRate", 0) or 0)
    mem_khz = _attr(rt, _ATTR_MEMORY_CLOCK_RATE, index) or int(p.get("memoryClockRate", 0) or 0)
    bus = _attr(rt, _ATTR_GLOBAL_MEMORY_BUS_WIDTH, index) or int(p.get("memoryBusWidth", 0) or 0)
    ghz = clock_khz / 1e6 if clock_khz else 1.5
    tc = _TC_FLOPS_PER_CLK.get(cc, 1024 if cc >= (8, 0) else 512)
    fp32 = _FP32_FLOPS_PER_CLK.get(cc, 256 if cc[0] >= 9 else 128)
    peak = {"float16": sms * ghz * tc, "bfloat16": sms * ghz * tc, "tf32": sms * ghz * tc / 2,
            "float32": sms * ghz * fp32}
    v = toolkit.versions()
    return DeviceProfile(
        device=Device("cuda", index), name=name, backend="cuda", vendor="NVIDIA",
        arch=toolkit.arch_name(cc), compute_units=sms, isa=isa_flags(cc), compute_capability=cc,
        warp_size=int(p.get("warpSize", 32)), max_threads_per_block=int(p.get("maxThreadsPerBlock", 1024)),
        shared_mem_per_block=int(p.get("sharedMemPerBlockOptin", 0) or p.get("sharedMemPerBlock", 49152)),
        shared_mem_per_sm=int(p.get("sharedMemPerMultiprocessor", 0)),
        registers_per_block=int(p.get("regsPerBlock", 65536)),
        registers_per_sm=int(p.get("regsPerMultiprocessor", 65536)),
        caches={"L2": int(p.get("l2CacheSize", 0))}, memory_bytes=int(p.get("totalGlobalMem", 0)),
        peak_gflops=peak, bandwidth_gbs=(mem_khz * 1e3 * 2 * bus / 8 / 1e9) if mem_khz and bus else 1000.0,
        driver_version=v["driver"], runtime_version=v["runtime"],
        extras={"tensor_core_gen": _TC_GEN.get(cc[0], "pre-ampere"), "nvrtc": v["nvrtc"], "cupy": v["cupy"],
                "sm_clock_mhz": str(clock_khz // 1000)})


#: the CUDA MPS client setting that limits a process to a share of the SMs (percent)
MPS_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def resident_sms(profile: DeviceProfile) -> int:
    """SMs this process can count on having at once: the profile's, scaled down by an MPS active-thread
    percentage below 100 (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). Kernels whose CTAs wait for each other
    (split-K, stream-K) size their grids by this, so every CTA they wait for is resident."""
    units = int(profile.compute_units or 1)
    raw = os.environ.get(MPS_PERCENTAGE_ENV, "").strip()
    try:
        pct = float(raw) if raw else 100.0
    except ValueError:
        return units
    if 0 < pct < 100:
        return max(1, int(units * pct / 100))
    return units


def profiles() -> list[DeviceProfile]:
    ok, _ = toolkit.status()
    if not ok:
        return []
    out = []
    for i in range(toolkit.device_count()):
        try:
            out.append(profile(i))
        except Exception:
            continue
    return out
