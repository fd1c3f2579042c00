"""Probe of the float32 NCHW conv paths through the user path (``tracea.ops.conv2d`` on CUDA tensors,
TF32 as ``F.conv2d`` computes it, calls back to back between CUDA events), against PyTorch in the same
run: the default choice, ``cuda.conv2d.implicit_mma`` reading NCHW directly (one launch) or through the
channels-last transposes (three launches), and ``cuda.conv2d.wgmma`` (transposes + the Hopper kernel).

    python benchmarks/cuda/probe_conv_nchw.py [--batches 1,8,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import tracea
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import paired  # noqa: E402

LAYERS = [(64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1), (512, 512, 7, 3, 1), (256, 256, 56, 3, 1),
          (128, 256, 28, 3, 2)]


def _mma(tm: int, tn: int, warps: int, mode: str) -> PipelineConfig:
    return PipelineConfig(tm, tn, 32, 3, warps, SwizzleMode.XOR8, BarrierMode.SYNC,
                          (("warp_m", 2), ("nchw_mode", mode)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for (c, k, h, r, s) in LAYERS:
            x = torch.randn(batch, c, h, h, device="cuda")
            w = torch.randn(k, c, r, r, device="cuda") / (c * r * r) ** 0.5
            b = torch.randn(k, device="cuda")
            theirs = lambda: F.conv2d(x, w, b, stride=s, padding=r // 2)  # noqa: E731
            paths = {"default": {}}
            for tm, tn, wp in ((64, 64, 4), (128, 128, 8)):
                for mode in ("direct", "transform"):
                    paths[f"mma {mode} {tm}x{tn}"] = {"variant": "cuda.conv2d.implicit_mma",
                                                       "config": _mma(tm, tn, wp, mode)}
            paths["wgmma"] = {"variant": "cuda.conv2d.wgmma"}
            line = {}
            for name, kw in paths.items():
                ours = lambda kw=kw: tracea.ops.conv2d(x, w, b, stride=s, padding=r // 2, **kw)  # noqa: E731
                try:
                    ours()
                except tracea.TraceaError as exc:
                    line[name] = f"refused ({type(exc).__name__})"
                    continue
                t, a, _ = paired(ours, theirs, rounds=5)
                line[name] = round(a / t, 2)
                rows.append({"batch": batch, "layer": [c, k, h, r, s], "path": name, "tracea_s": t, "torch_s": a})
            print(f"b{batch} {c}->{k} {r}x{r}/{s} @{h}^2: " + "  ".join(f"{n} {v}" for n, v in line.items()),
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
