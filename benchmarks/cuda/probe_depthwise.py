"""Probe of ``cuda.conv2d.depthwise``'s configurations on the depthwise / grouped layers of
``bench_shapes.py --groups grouped`` (EfficientNet, MobileNetV2, ConvNeXt, ResNeXt, RegNet), against cuDNN
(``F.conv2d``) in one run, so the hero order and the variant's declines follow measurements.

Per layer it prints cuDNN's kernel time, the default (first hero) config's and the best probed config's, all
as calls replayed from a CUDA graph (device time only), with the ratios cuDNN / Tracea and the bytes per second
of the best (x, w and the output once). At the end, every config shape's geometric mean share of each layer's
best time, best first.

    python benchmarks/cuda/probe_depthwise.py [--families resnext,regnet] [--batches 1,8,32]
        [--dtypes float16,float32] [--sample 12] [--space "threads=128,256 cv=4,8,16 ppt=2,4 vec=8,4 rows=2,4 kpt=4,8"]
        [--json out.json]

``--sample`` caps the search-space points probed per layer (an even spread; the heroes always run);
``--space`` adds a grid of NHWC or NCHW params (each combination the layer validates). Shapes the variant
declines by default (wide groups where cuDNN measured faster) are timed too, marked ``(declined)``. Every kernel is compiled
by a process pool first. The reference is float64 (cuDNN's fp32 conv runs TF32 unless told otherwise, which
made every exact fp32 config look wrong); a config outside the tolerance is reported and not timed, and a
layer where none passes says so (no crash).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import tracea
from tracea.errors import TraceaError
from tracea.ir.ops import Conv2dOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda.testing import gpu_profile
from tracea_cuda.variants import depthwise
from tracea_cuda.variants.depthwise import DepthwiseConv

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import GROUPED_CONVS, graph_time  # noqa: E402


def shape_of(config) -> str:
    """A config's parameters without the layer-specific clamps, for the summary."""
    return ".".join(f"{k}={v}" for k, v in sorted(config.params))


def grid_configs(text: str, op: Conv2dOp, variant: DepthwiseConv, profile) -> list[PipelineConfig]:
    """The combinations of ``--space`` (``name=v,v name=v``) the op's layout takes and validates."""
    if not text:
        return []
    axes = [(name, [int(v) for v in vals.split(",")]) for name, vals in (part.split("=") for part in text.split())]
    nchw = op.layout.name == "NCHW"
    axes = [(n, vs) for n, vs in axes if (n in ("threads", "rows", "kpt")) == nchw or n == "threads"]
    out = []
    for combo in itertools.product(*(vs for _, vs in axes)):
        cfg = PipelineConfig(params=tuple(zip((n for n, _ in axes), combo)))
        if variant.validate_config(op, cfg, profile):
            out.append(cfg)
    return out


def _compile(item: tuple[str, str, str]) -> bool:
    """Worker: compile one kernel into the disk cache (no CUDA context needed)."""
    from tracea_cuda import compiler  # noqa: PLC0415

    return compiler.precompile(*item)


def precompile(jobs: list[tuple[Conv2dOp, PipelineConfig]], variant: DepthwiseConv) -> None:
    """Every probed kernel compiled into the disk cache by a process pool (the probe then loads them)."""
    from tracea_cuda import toolkit  # noqa: PLC0415
    from tracea_cuda.emit.depthwise import KERNEL_NAME, render  # noqa: PLC0415

    arch = toolkit.arch_name(torch.cuda.get_device_capability())
    srcs = set()
    for op, cfg in jobs:
        try:
            srcs.add((render(variant.spec(op, cfg, None)), KERNEL_NAME, arch))
        except TraceaError:
            continue
    with cf.ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4), mp_context=mp.get_context("spawn")) as ex:
        done = list(ex.map(_compile, srcs, chunksize=4))
    print(f"{len(srcs)} kernels ({sum(done)} compiled)", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="", help="comma-separated substrings of the family names (default all)")
    p.add_argument("--batches", default="32")
    p.add_argument("--dtypes", default="float16,float32")
    p.add_argument("--sample", type=int, default=12)
    p.add_argument("--space", default="", help="a grid of params to add, e.g. 'threads=128,256 cv=4,8 ppt=2,4'")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    variant, profile = DepthwiseConv(), gpu_profile()
    depthwise.DECLINE_WIDE_GROUPS = False  # time the shapes the variant leaves to cuDNN by default too
    wanted = [f for f in args.families.split(",") if f]
    cases = []
    for family, layers in GROUPED_CONVS.items():
        if wanted and not any(f in family for f in wanted):
            continue
        for (c, h, r, s, g), batch, dt in itertools.product(layers, map(int, args.batches.split(",")),
                                                             args.dtypes.split(",")):
            cl = dt != "float32"
            op = Conv2dOp(batch, c, h, h, c, r, r, stride=s, padding=r // 2, groups=g,
                          layout="nhwc" if cl else "nchw", dtype=dt, epilogue="bias",
                          fp32_precision="high" if torch.backends.cudnn.allow_tf32 else "highest")
            depthwise.DECLINE_WIDE_GROUPS = True
            declined = variant._cudnn_faster(op, c // g)
            depthwise.DECLINE_WIDE_GROUPS = False
            heroes = variant.hero_configs(op, profile)
            space = list(variant.search_space(op, profile))
            step = max(1, len(space) // max(args.sample, 1)) if args.sample > 0 else len(space) + 1
            configs = list(dict.fromkeys(heroes + grid_configs(args.space, op, variant, profile) + space[::step]))
            cases.append((family, (c, h, r, s, g), batch, dt, op, heroes, configs, bool(declined)))
    precompile([(op, cfg) for *_, op, _, configs, _ in cases for cfg in configs], variant)
    rows, shares = [], {}
    print(f"{torch.cuda.get_device_name()}: {variant.name}, graph-replayed device time per call")
    for family, (c, h, r, s, g), batch, dt, op, heroes, configs, declined in cases:
        dtype = getattr(torch, dt)
        cl = dtype is not torch.float32
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        w = (torch.randn(c, c // g, r, r, device="cuda", dtype=dtype) / (c // g * r * r) ** 0.5).contiguous(
            memory_format=fmt)
        bias = torch.randn(c, device="cuda", dtype=dtype)
        ref = F.conv2d(x.double(), w.double(), bias.double(), s, r // 2, 1, g)  # no TF32 in the reference
        t_torch = graph_time(lambda: F.conv2d(x, w, bias, s, r // 2, 1, g))  # noqa: B023
        what = f"{family} {c} g{g} {r}x{r}/{s} @{h}^2 b{batch} {dt}{' CL' if cl else ''}{' (declined)' if declined else ''}"
        times = {}
        for cfg in configs:
            def fn(cfg=cfg):
                return tracea.ops.conv2d(x, w, bias, stride=s, padding=r // 2, groups=g,  # noqa: B023
                                         variant=variant.name, config=cfg)
            try:
                out = fn()
            except TraceaError as exc:
                print(f"    {shape_of(cfg)}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            err = float((out.double() - ref).norm() / ref.norm())
            if not err < (1e-2 if cl else 1e-5):
                print(f"    {shape_of(cfg)}: rel err {err:.2e} (not timed)")
                continue
            times[cfg] = graph_time(fn)
        if not times:
            print(f"  {what:<48} cudnn {t_torch * 1e6:7.1f} us  no config passed the check", flush=True)
            rows.append({"what": what, "torch_s": t_torch, "hero": shape_of(heroes[0]) if heroes else None,
                         "hero_s": None, "best": None, "best_s": None, "configs": {}})
            continue
        best = min(times, key=times.get)
        hero_t = times.get(heroes[0], math.nan) if heroes else math.nan
        gbs = op.min_bytes / times[best] / 1e9
        print(f"  {what:<48} cudnn {t_torch * 1e6:7.1f} us  hero {hero_t * 1e6:7.1f} us "
              f"({t_torch / hero_t:4.2f}x)  best {times[best] * 1e6:7.1f} us ({t_torch / times[best]:4.2f}x, "
              f"{gbs:5.0f} GB/s) {shape_of(best)}  [hero {shape_of(heroes[0]) if heroes else '-'}]", flush=True)
        rows.append({"what": what, "torch_s": t_torch, "hero": shape_of(heroes[0]) if heroes else None,
                     "hero_s": hero_t, "best": shape_of(best), "best_s": times[best],
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
