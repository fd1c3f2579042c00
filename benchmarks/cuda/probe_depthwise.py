"""Probe of ``cuda.conv2d.depthwise``'s configurations on the depthwise / grouped layers of
``bench_shapes.py --groups grouped`` (EfficientNet, MobileNetV2, ConvNeXt, ResNeXt, RegNet), against cuDNN
(``F.conv2d``) in one run, so the hero order can follow measurements (the first heroes were set by reasoning).

Per layer it prints cuDNN's kernel time, the default (first hero) config's and the best probed config's, all
as calls replayed from a CUDA graph (device time only), with the ratios cuDNN / Tracea and the bytes per second
of the best (x, w and the output once). At the end, every config shape's geometric mean share of each layer's
best time, best first.

    python benchmarks/cuda/probe_depthwise.py [--batches 32] [--dtypes float16,float32] [--sample 12] [--json out.json]

``--sample`` caps the search-space points probed per layer (an even spread; the heroes always run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import tracea
from tracea.ir.ops import Conv2dOp

from tracea_cuda.testing import gpu_profile
from tracea_cuda.variants.depthwise import DepthwiseConv

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import GROUPED_CONVS, graph_time  # noqa: E402


def shape_of(config) -> str:
    """A config's parameters without the layer-specific clamps, for the summary."""
    return ".".join(f"{k}={v}" for k, v in sorted(config.params))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="32")
    p.add_argument("--dtypes", default="float16,float32")
    p.add_argument("--sample", type=int, default=12)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    variant, profile = DepthwiseConv(), gpu_profile()
    rows, shares = [], {}
    print(f"{torch.cuda.get_device_name()}: {variant.name}, graph-replayed device time per call")
    for family, layers in GROUPED_CONVS.items():
        for (c, h, r, s, g) in layers:
            for batch in map(int, args.batches.split(",")):
                for dt in args.dtypes.split(","):
                    dtype = getattr(torch, dt)
                    cl = dtype is not torch.float32
                    fmt = torch.channels_last if cl else torch.contiguous_format
                    x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                    w = (torch.randn(c, c // g, r, r, device="cuda", dtype=dtype) / r).contiguous(memory_format=fmt)
                    bias = torch.randn(c, device="cuda", dtype=dtype)
                    op = Conv2dOp(batch, c, h, h, c, r, r, stride=s, padding=r // 2, groups=g,
                                  layout="nhwc" if cl else "nchw", dtype=dt, epilogue="bias",
                                  fp32_precision="high" if torch.backends.cudnn.allow_tf32 else "highest")
                    heroes = variant.hero_configs(op, profile)
                    space = list(variant.search_space(op, profile))
                    step = max(1, len(space) // max(args.sample, 1))
                    configs = list(dict.fromkeys(heroes + space[::step]))
                    ref = F.conv2d(x, w, bias, s, r // 2, 1, g)
                    t_torch = graph_time(lambda: F.conv2d(x, w, bias, s, r // 2, 1, g))  # noqa: B023
                    times = {}
                    for cfg in configs:
                        def fn(cfg=cfg):
                            return tracea.ops.conv2d(x, w, bias, stride=s, padding=r // 2, groups=g,  # noqa: B023
                                                     variant=variant.name, config=cfg)
                        out = fn()
                        err = float((out.double() - ref.double()).norm() / ref.double().norm())
                        if not err < (1e-2 if cl else 1e-4):
                            print(f"    {shape_of(cfg)}: rel err {err:.2e} (not timed)")
                            continue
                        times[cfg] = graph_time(fn)
                    best = min(times, key=times.get)
                    hero_t = times.get(heroes[0], math.nan)
                    what = f"{family} {c} g{g} {r}x{r}/{s} @{h}^2 b{batch} {dt}{' CL' if cl else ''}"
                    gbs = op.min_bytes / times[best] / 1e9
                    print(f"  {what:<48} cudnn {t_torch * 1e6:7.1f} us  hero {hero_t * 1e6:7.1f} us "
                          f"({t_torch / hero_t:4.2f}x)  best {times[best] * 1e6:7.1f} us ({t_torch / times[best]:4.2f}x, "
                          f"{gbs:5.0f} GB/s) {shape_of(best)}", flush=True)
                    rows.append({"what": what, "torch_s": t_torch, "hero": shape_of(heroes[0]), "hero_s": hero_t,
                                 "best": shape_of(best), "best_s": times[best],
                                 "configs": {shape_of(k): v for k, v in times.items()}})
                    for k, v in times.items():
                        shares.setdefault((op.layout.name, shape_of(k)), []).append(times[best] / v)
    print("\nconfig shapes by geometric mean share of each layer's best (layers where they ran):")
    ranked = sorted(shares.items(), key=lambda kv: -statistics.geometric_mean(kv[1]))
    for (layout, name), vals in ranked[:25]:
        print(f"  {layout} {name:<40} {statistics.geometric_mean(vals):.3f} over {len(vals)} layers, worst {min(vals):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
