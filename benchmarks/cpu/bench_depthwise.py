"""Depthwise conv2d on the CPU through the user path against PyTorch, interleaved in one run: per layer (the
depthwise layers of EfficientNet-B0, MobileNetV2 / V3 and ConvNeXt-style 7x7 at several batches, NCHW float32,
bias), ``tracea.ops.conv2d(x, w, b, groups=C)`` on torch CPU tensors (default settings, untuned: the Doctor's
choice, ``cpu.conv2d.depthwise.<isa>``) and a patched ``nn.Conv2d`` (``tracea_torch.patch_conv2d``, arbiter on:
its verdict names the side that serves) against ``F.conv2d``; ratio = PyTorch time / Tracea time.

    source scripts/srcenv.sh
    python benchmarks/cpu/bench_depthwise.py [--rounds 15] [--batches 1,2,8] [--dtype bfloat16] [--json out.json]

PyTorch's CPU depthwise conv allocates scratch per call; whether glibc hands it memory that is already mapped
or maps it afresh (page faults on every call) depends on the heap's state, so the same call measured up to 14x
apart between processes (2-core Zen 4 VM). ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_MMAP_THRESHOLD_`` (printed)
pin the favourable state for PyTorch; run both ways.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import tracea
import tracea_torch
from tracea.runtime import plans
from tracea.tuning.cache import TuningCache, set_cache
from tracea_torch import arbiter

#: (channels, size, kernel, stride): EfficientNet-B0 / MobileNetV2 / MobileNetV3 / ConvNeXt-T depthwise layers
LAYERS = [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 5, 2), (240, 28, 5, 1), (480, 14, 3, 1),
          (672, 14, 5, 1), (1152, 7, 5, 1), (16, 112, 3, 2), (576, 14, 3, 1), (96, 56, 7, 1), (384, 14, 7, 1)]


def interleaved(ours, theirs, rounds: int) -> tuple[float, float]:
    ours(), theirs()
    calls = max(1, int(2e-3 / max(_once(ours), 1e-6)))
    ta, tb = [], []
    for r in range(rounds):
        for f, acc in ((ours, ta), (theirs, tb)) if r % 2 == 0 else ((theirs, tb), (ours, ta)):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            acc.append((time.perf_counter() - t0) / calls)
    return statistics.median(ta), statistics.median(tb)


def _once(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def layer_row(batch: int, c: int, hw: int, k: int, st: int, rounds: int, dtype: torch.dtype = torch.float32) -> dict:
    """One layer: ``tracea.ops.conv2d`` and a patched ``nn.Conv2d`` against ``F.conv2d`` / the unpatched module."""
    x = torch.randn(batch, c, hw, hw, dtype=dtype)
    conv = torch.nn.Conv2d(c, c, k, stride=st, padding=k // 2, groups=c).to(dtype)
    w, b = conv.weight.detach(), conv.bias.detach()
    patched = torch.nn.Conv2d(c, c, k, stride=st, padding=k // 2, groups=c).to(dtype)
    patched.load_state_dict(conv.state_dict())
    tracea_torch.patch_conv2d(patched)

    def ours() -> torch.Tensor:
        return tracea.ops.conv2d(x, w, b, stride=st, padding=k // 2, groups=c)

    def theirs() -> torch.Tensor:
        return F.conv2d(x, w, b, st, k // 2, 1, c)

    with torch.no_grad():
        ref = theirs()
        out = ours()
        runner = getattr(plans.latest(), "runner", None)
        err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
        t_ops, t_ref = interleaved(ours, theirs, rounds)
        arbiter.reset()
        patched(x)
        verdict = next((v.winner for v in arbiter.verdicts()), "none")
        t_mod, t_ref2 = interleaved(lambda: patched(x), lambda: conv(x), rounds)
    return dict(case=f"b{batch} {c}@{hw}^2 {k}x{k}/{st}", variant=getattr(runner, "variant", None) or "pytorch",
                ops_us=t_ops * 1e6, torch_us=t_ref * 1e6, ops_ratio=t_ref / t_ops, module_us=t_mod * 1e6,
                module_torch_us=t_ref2 * 1e6, module_ratio=t_ref2 / t_mod, verdict=verdict, err=err)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batches", default="1,2,8")
    ap.add_argument("--json", default="")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: the anchor is F.conv2d in bf16 for the ops column, the unpatched module (bf16) for "
                         "the module column")
    args = ap.parse_args()
    set_cache(TuningCache(os.path.join(tempfile.mkdtemp(), "cache.json")))
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); malloc env {malloc or 'default'}")
    rows, ratios = [], []
    torch.manual_seed(0)
    for batch in (int(b) for b in args.batches.split(",")):
        for c, hw, k, st in LAYERS:
            row = layer_row(batch, c, hw, k, st, args.rounds, getattr(torch, args.dtype))
            rows.append(row)
            ratios.append(row["module_ratio"])
            print(f"  {row['case']:<22} ops {row['ops_us']:8.1f} / {row['torch_us']:8.1f} us {row['ops_ratio']:5.2f}x   "
                  f"module {row['module_us']:8.1f} / {row['module_torch_us']:8.1f} us {row['module_ratio']:5.2f}x "
                  f"({row['verdict']})  err {row['err']:.1e}  {row['variant']}", flush=True)
    ops = sorted(r["ops_ratio"] for r in rows)
    mods = sorted(ratios)
    print(f"{len(rows)} layers: ops median {statistics.median(ops):.2f}x (min {ops[0]:.2f}x); patched module median "
          f"{statistics.median(mods):.2f}x (min {mods[0]:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, malloc=malloc), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
