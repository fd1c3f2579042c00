"""A/B of the per-call thread cap (``tracea_cpu.host_load``) in one process: the same GEMM through two
launchers bound from the same variant and config, one capping its automatic thread count at the cores
other processes leave free (the default), one not (``TRACEA_CPU_ADAPT_THREADS=0`` while it is bound),
interleaved with the anchor (bf16: ``torch.matmul``; fp32: NumPy), fresh outputs every call as the user
path allocates them; medians over the rounds.

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/busy_threads.py [--hogs N] [--sizes 512,1024]
        [--rounds 41] [--only bf16,fp32]

``--hogs N`` starts N busy-looping processes for the duration (a controlled load; 0: whatever the machine
is doing). Prints the load average and the cap's estimate of the other processes' busy cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tracea.doctor.host_plugin import host_profile  # noqa: E402
from tracea.ir.ops import GemmOp  # noqa: E402
from tracea.runtime.arrays import NumpyAdapter  # noqa: E402
from tracea_cpu import host_load  # noqa: E402
from tracea_cpu.amx import CpuGemmAmxVariant, amx_permission  # noqa: E402
from tracea_cpu.isa import ISA_BY_NAME  # noqa: E402
from tracea_cpu.variants import CpuGemmVariant  # noqa: E402
from tracea_torch.adapter import TorchAdapter  # noqa: E402

PROFILE = host_profile()


def _bound_pair(variant, op, adapter):
    """(capped launcher, uncapped launcher) of the variant's first hero."""
    cfg = variant.hero_configs(op, PROFILE)[0]
    old = os.environ.pop("TRACEA_CPU_ADAPT_THREADS", None)
    try:
        capped = variant.bind(op, cfg, PROFILE, adapter)
        os.environ["TRACEA_CPU_ADAPT_THREADS"] = "0"
        fixed = variant.bind(op, cfg, PROFILE, adapter)
    finally:
        os.environ.pop("TRACEA_CPU_ADAPT_THREADS", None)
        if old is not None:
            os.environ["TRACEA_CPU_ADAPT_THREADS"] = old
    return capped, fixed


def _rounds(fns: dict, rounds: int) -> dict:
    for f in fns.values():
        f()
    ts: dict = {k: [] for k in fns}
    for r in range(rounds):
        for k, f in (list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]):
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def _bf16_fns(n: int) -> dict:
    a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    op = GemmOp(n, n, n, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
    capped, fixed = _bound_pair(CpuGemmAmxVariant(), op, TorchAdapter())
    return {"capped": lambda: capped(a, b, None, torch.empty(n, n, dtype=torch.bfloat16)),
            "fixed": lambda: fixed(a, b, None, torch.empty(n, n, dtype=torch.bfloat16)),
            "torch": lambda: torch.matmul(a, b)}


def _fp32_fns(n: int) -> dict:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    capped, fixed = _bound_pair(CpuGemmVariant(ISA_BY_NAME["avx512"]), GemmOp(n, n, n), NumpyAdapter())
    return {"capped": lambda: capped(a, b, None, np.empty((n, n), np.float32)),
            "fixed": lambda: fixed(a, b, None, np.empty((n, n), np.float32)),
            "numpy": lambda: a @ b}


def _show(label: str, flops: float, t: dict, anchor: str) -> None:
    cells = "  ".join(f"{k} {flops / s / 1e9:6.0f} GF/s {t[anchor] / s:5.2f}x" for k, s in t.items())
    print(f"{label:>12}  {cells}  (others busy: {host_load._FREE.others() or 0.0:.2f} cores)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--only", default="bf16,fp32")
    ns = ap.parse_args(argv)
    if os.environ.get("TRACEA_NUM_THREADS"):
        print("TRACEA_NUM_THREADS is set: no launcher caps its thread count")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ns.hogs)]
    try:
        time.sleep(0.3 if hogs else 0)
        print(f"{PROFILE.name}, {PROFILE.compute_units} cores; {ns.hogs} busy-loop processes; torch "
              f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}")
        for n in (int(s) for s in ns.sizes.split(",")):
            if "bf16" in ns.only and PROFILE.has("amx_tile", "amx_bf16") and amx_permission() is None:
                _show(f"bf16 {n}", 2.0 * n ** 3, _rounds(_bf16_fns(n), ns.rounds), "torch")
            if "fp32" in ns.only and PROFILE.has("avx512f"):
                _show(f"fp32 {n}", 2.0 * n ** 3, _rounds(_fp32_fns(n), ns.rounds), "numpy")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        for h in hogs:
            h.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
