"""Probe of the Hopper conv's hero tiles (``cuda.conv2d.wgmma``) on convs whose 128x128 grid is under two waves,
where ``variants/hopper_conv.py`` orders the four tiles by :func:`few_wave_cost`: per conv, the default
decision's device time, cuDNN's, and every hero tile's, and at the end how far the rule's pick and the
first tile of the fixed order it replaced (64x128 ping-pong) are from the best tile (mean and worst ratio).
Device times are calls replayed from a CUDA graph (no host time); fp16 channels_last unless ``--fp32``
(NCHW, TF32 as F.conv2d by default).

    python benchmarks/cuda/probe_conv_tiles.py [--batches 1,8,32] [--fp32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import tracea.ops
from tracea.ir.ops import Conv2dOp, Layout
from tracea.runtime import plans

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import graph_time  # noqa: E402

#: (C, K, H, R): ResNet-50 3x3 / 1x1 layers and DenseNet / MobileNet / EfficientNet widths
CONVS = [(64, 64, 56, 3), (128, 128, 28, 3), (256, 256, 14, 3), (512, 512, 7, 3), (256, 64, 56, 1), (512, 128, 28, 1),
         (1024, 256, 14, 1), (2048, 512, 7, 1), (64, 256, 56, 1), (128, 512, 28, 1), (160, 160, 14, 3), (96, 96, 28, 3),
         (80, 80, 28, 3), (112, 112, 14, 3), (192, 192, 14, 3), (48, 48, 56, 3), (320, 320, 7, 3), (384, 96, 14, 1),
         (144, 144, 28, 3), (240, 240, 14, 3)]


def measure(batch: int, c: int, k: int, h: int, r: int, dtype: torch.dtype, fmt: torch.memory_format,
            heroes: dict) -> tuple[dict, float, float, str]:
    """(device us per hero tile, the default decision's us, cuDNN's us, the default's variant) of one conv."""
    x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(k, c, r, r, device="cuda", dtype=dtype) / (c * r * r) ** 0.5).contiguous(memory_format=fmt)
    b = torch.randn(k, device="cuda", dtype=dtype)
    pad = r // 2
    tracea.ops.conv2d(x, w, b, 1, pad)
    runner = plans._plans[[key for key in plans._plans if key[0] == "conv2d"][-1]].runner
    times = {}
    for name, cfg in heroes.items():
        try:
            times[name] = graph_time(lambda cfg=cfg: tracea.ops.conv2d(x, w, b, 1, pad, variant="cuda.conv2d.wgmma",
                                                                       config=cfg)) * 1e6
        except Exception as exc:  # noqa: BLE001 - a tile the variant declines for this conv
            print(f"  {name}: {type(exc).__name__}")
    default = graph_time(lambda: tracea.ops.conv2d(x, w, b, 1, pad)) * 1e6
    cudnn = graph_time(lambda: F.conv2d(x, w, b, 1, pad)) * 1e6
    return times, default, cudnn, str(runner.variant or runner.reason)


def main() -> None:
    from tracea.doctor.doctor import get_doctor
    from tracea_cuda.device import resident_sms
    from tracea_cuda.variants.hopper import _hero
    from tracea_cuda.variants.hopper_conv import few_wave_cost

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--fp32", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    dtype, fmt = (torch.float32, torch.contiguous_format) if args.fp32 else (torch.float16, torch.channels_last)
    profile = get_doctor().profile_for("cuda:0")
    ctas = resident_sms(profile)
    print(f"{torch.cuda.get_device_name()}: {ctas} resident CTAs; {dtype}, {'NCHW' if args.fp32 else 'channels_last'}")
    heroes = {"128x128 coop": _hero(128, 6), "64x128 pingpong": _hero(128, 6, bm=64, schedule="pingpong"),
              "128x64 coop": _hero(64, 7), "64x64 pingpong": _hero(64, 7, bm=64, schedule="pingpong")}
    rows, picked, replaced = [], [], []
    for batch in (int(b) for b in args.batches.split(",")):
        for c, k, h, r in CONVS:
            m = batch * h * h
            if k <= 64 or -(-m // 128) * -(-k // 128) >= 2 * ctas:
                continue  # other rules order those heroes
            times, default, cudnn, variant = measure(batch, c, k, h, r, dtype, fmt, heroes)
            if not times:
                continue
            pad = r // 2
            op = Conv2dOp(batch, c, h, h, k, r, r, padding=(pad, pad), layout=Layout.NHWC)
            gm, gn, _ = op.gemm_mnk
            rule = min(times, key=lambda n: few_wave_cost(gm, gn, heroes[n], ctas))
            best = min(times, key=times.get)
            picked.append(times[rule] / times[best])
            if "64x128 pingpong" in times:
                replaced.append(times["64x128 pingpong"] / times[best])
            print(f"b{batch} {c}->{k} {r}x{r} @{h}^2: default {variant} {default:6.1f} us, cuDNN {cudnn:6.1f} us | "
                  + "  ".join(f"{n} {t:5.1f}" for n, t in times.items()) + f" | rule: {rule}, best: {best}")
            rows.append({"batch": batch, "c": c, "k": k, "h": h, "r": r, "default_us": default, "cudnn_us": cudnn,
                         "tiles_us": times, "rule": rule, "best": best})
    if picked:
        print(f"rule's tile / best tile: mean {statistics.mean(picked):.3f}x, worst {max(picked):.2f}x over {len(picked)} convs"
              + (f"; 64x128 ping-pong first (the order before): mean {statistics.mean(replaced):.3f}x, worst "
                 f"{max(replaced):.2f}x" if replaced else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
