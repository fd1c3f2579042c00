"""Probe: 16-bit NCHW 1x1 stride-1 convs (ResNet-50 and MobileNetV2 widths) through ``tracea.ops.conv2d`` with the
default decision against ``F.conv2d``, eager and in CUDA graphs (20-call blocks, paired), with the Doctor's pick; where
``cuda.conv2d.wgmma`` (the channels-last transpose path) also serves a layer, both forced side by side.

    source scripts/srcenv.sh
    python benchmarks/cuda/probe_nchw1x1.py [--batches 1,8,32] [--dtype float16]

``--sweep`` times every hero config of ``cuda.conv2d.wgmma_nchw1x1`` (and a few more) per layer instead.
``--channels-last`` times the same layers in channels_last memory: ``cuda.conv2d.wgmma``,
``cuda.conv2d.implicit_mma`` and the default decision against cuDNN, in CUDA graphs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "user_path"))

import tracea  # noqa: E402
from bench_user_path import graphed, paired  # noqa: E402
from tracea.doctor import get_doctor  # noqa: E402
from tracea.ir.ops import Conv2dOp  # noqa: E402

NAME = "cuda.conv2d.wgmma_nchw1x1"
#: (C, K, H=W)
R50 = [(64, 256, 56), (256, 64, 56), (256, 128, 56), (128, 512, 28), (512, 128, 28), (512, 256, 28), (256, 1024, 14),
       (1024, 256, 14), (1024, 512, 14), (512, 2048, 7), (2048, 512, 7)]
MBV2 = [(16, 96, 112), (24, 144, 56), (144, 24, 56), (32, 192, 28), (192, 32, 28), (64, 384, 14), (384, 64, 14),
        (96, 576, 14), (576, 96, 14), (160, 960, 7), (960, 160, 7), (320, 1280, 7), (40, 240, 28), (240, 40, 28),
        (112, 672, 14), (672, 112, 14)]


def layer(n: int, c: int, k: int, h: int, dt: torch.dtype, sweep: bool) -> None:
    dev = torch.device("cuda")
    d = get_doctor()
    x = torch.randn(n, c, h, h, device=dev, dtype=dt)
    w = torch.randn(k, c, 1, 1, device=dev, dtype=dt) / c ** 0.5
    b = torch.randn(k, device=dev, dtype=dt)
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double()))
    op = Conv2dOp(n, c, h, h, k, 1, 1, dtype=str(dt)[6:], layout="nchw", epilogue="bias+relu", fp32_precision="high")
    theirs = lambda: F.relu(F.conv2d(x, w, b))  # noqa: E731
    if sweep:
        from tracea_cuda.variants.hopper import _hero

        variant = next(v for v in d.registry if v.name == NAME)
        profile = d.profile_for("cuda")
        heroes = variant.hero_configs(op, profile)
        extra = [_hero(bn, st, bm=bm, schedule=sc) for bm, bn, sc, st in
                 ((128, 128, "coop", 6), (128, 64, "coop", 8), (64, 128, "pingpong", 6), (64, 64, "pingpong", 8))]
        gt = graphed(theirs)
        rows = []
        for cfg in dict.fromkeys(heroes + extra + [_hero(128, 6, split_k=2)]):
            if not variant.validate_config(op, cfg, profile):
                continue
            f = lambda cfg=cfg: tracea.ops.conv2d(x, w, b, activation="relu", variant=NAME, config=cfg)  # noqa: E731
            err = float((f().double() - ref).norm() / ref.norm())
            t1, t2 = paired(graphed(f), gt, 20, 7, dev)
            rows.append((t1, t2, f"{cfg.tile_m}x{cfg.tile_n} {cfg.get('schedule')} st{cfg.stages} "
                                 f"split{cfg.get('split_k') or 1}{' (default)' if cfg == heroes[0] else ''}", err))
        print(f"b{n} {c}->{k}@{h}:", flush=True)
        for t1, t2, key, err in sorted(rows):
            print(f"   {t1 * 1e6:7.1f} us {t2 / t1:5.2f}x cuDNN  {key}  err {err:.1e}", flush=True)
        return
    ours = lambda: tracea.ops.conv2d(x, w, b, activation="relu")  # noqa: E731
    err = float((ours().double() - ref).norm() / ref.norm())
    pick = d.decide(op, "cuda").variant.name.replace("cuda.conv2d.", "")
    te, tt = paired(ours, theirs, 20, 9, dev)
    ge, gt = paired(graphed(ours), graphed(theirs), 20, 9, dev)
    both = ""
    transpose = next(v for v in d.registry if v.name == "cuda.conv2d.wgmma")
    if not transpose.check(op, d.profile_for("cuda")):
        fa = lambda: tracea.ops.conv2d(x, w, b, activation="relu", variant="cuda.conv2d.wgmma")  # noqa: E731
        fb = lambda: tracea.ops.conv2d(x, w, b, activation="relu", variant=NAME)  # noqa: E731
        g1, g2 = paired(graphed(fa), graphed(fb), 20, 9, dev)
        both = f" | graphs: transpose path {g1 * 1e6:.1f} us, {NAME} {g2 * 1e6:.1f} us"
    print(f"b{n:2} {c:4}->{k:4} @{h:3}: eager {tt / te:5.2f}x  graphs {gt / ge:5.2f}x  (ours {ge * 1e6:6.1f} us, "
          f"cuDNN {gt * 1e6:6.1f} us in graphs)  err {err:.1e}  pick {pick}{both}", flush=True)


def layer_cl(n: int, c: int, k: int, h: int, dt: torch.dtype) -> None:
    dev = torch.device("cuda")
    d = get_doctor()
    cl = torch.channels_last
    x = torch.randn(n, c, h, h, device=dev, dtype=dt).contiguous(memory_format=cl)
    w = (torch.randn(k, c, 1, 1, device=dev, dtype=dt) / c ** 0.5).contiguous(memory_format=cl)
    b = torch.randn(k, device=dev, dtype=dt)
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double()))
    op = Conv2dOp(n, c, h, h, k, 1, 1, dtype=str(dt)[6:], layout="nhwc", epilogue="bias+relu")
    pick = d.decide(op, "cuda").variant.name.replace("cuda.conv2d.", "")
    gt = graphed(lambda: F.relu(F.conv2d(x, w, b)))
    cols = []
    for name in ("cuda.conv2d.wgmma", "cuda.conv2d.implicit_mma", None):
        f = lambda name=name: tracea.ops.conv2d(x, w, b, activation="relu", variant=name)  # noqa: E731
        try:
            err = float((f().double() - ref).norm() / ref.norm())
            t1, t2 = paired(graphed(f), gt, 20, 7, dev)
        except Exception as exc:  # noqa: BLE001 - a variant that declines the layer
            cols.append(f"{type(exc).__name__}")
            continue
        label = (name or f"default [{pick}]").replace("cuda.conv2d.", "")
        cols.append(f"{label} {t2 / t1:5.2f}x ({t1 * 1e6:6.1f} us, err {err:.0e})")
    print(f"CL b{n:2} {c:4}->{k:4} @{h:3}: graphs vs cuDNN: " + "  ".join(cols), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sweep", action="store_true", help="time the variant's configs per layer instead")
    ap.add_argument("--channels-last", action="store_true", help="channels_last layers: wgmma, implicit_mma, default")
    args = ap.parse_args()
    print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for n in map(int, args.batches.split(",")):
        for c, k, h in R50 + MBV2:
            if args.channels_last:
                layer_cl(n, c, k, h, getattr(torch, args.dtype))
            else:
                layer(n, c, k, h, getattr(torch, args.dtype), args.sweep)


if __name__ == "__main__":
    main()
