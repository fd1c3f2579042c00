"""Benchmark: a ResNet-style model and an MLP, eager PyTorch vs patched Tracea, side by side in one run.

    python packages/tracea-torch/benchmarks/bench_torch_model.py                   # CPU, float32
    python packages/tracea-torch/benchmarks/bench_torch_model.py --device cuda --dtype float16 --channels-last
    python packages/tracea-torch/benchmarks/bench_torch_model.py --tune 10        # tune as one graph first

Prints: which layers ran on a Tracea variant and which fell back (with the reason), the whole-model
forward time of both (median), the relative output error, the per-layer table of ``tracea_torch.tune``
and the host overhead per call of a small tracea-torch conv and linear. ``--json PATH`` writes every figure.
Run it under ``flock /tmp/tracea-bench.lock`` on shared machines.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import tracea_torch
from tracea_torch import fallbacks
from tracea_torch.models import BasicBlock as Block


def resnet_style(width: int = 64, classes: int = 100) -> nn.Module:
    """ResNet-18 layout (one block per stage to keep CPU runs short)."""
    w = width
    return nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                         Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2), Block(4 * w, 8 * w, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, classes))


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.ReLU(),
                         nn.Linear(width, width))


def median_time(fn, device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(name: str, model: nn.Module, x: torch.Tensor, args: argparse.Namespace) -> dict:
    dev = x.device
    patched = copy.deepcopy(model)
    tracea_torch.patch_conv2d(patched)
    tracea_torch.patch_linear(patched)
    fallbacks.reset()
    with torch.no_grad():
        ref = model(x)
        out = patched(x)
        fb = fallbacks.counts()
        rel = float((out.double() - ref.double()).norm() / ref.double().norm())
        t_torch = median_time(lambda: model(x), dev, args.warmup, args.repeats)
        t_tracea = median_time(lambda: patched(x), dev, args.warmup, args.repeats)
    print(f"\n[{name}] input {tuple(x.shape)} {x.dtype} on {dev}")
    print(f"  eager PyTorch {t_torch * 1e3:9.3f} ms | patched Tracea {t_tracea * 1e3:9.3f} ms | "
          f"ratio torch/tracea {t_torch / t_tracea:5.2f}x | rel err {rel:.2e}")
    for (kind, reason), n in sorted(fb.items()):
        print(f"  fallback {kind} x{n}: {reason}")
    report = tracea_torch.tune(patched, x, iterations=args.tune, graph_tuning=args.tune > 0,
                               warmup=args.warmup, repeats=args.repeats)
    print("\n".join("  " + line for line in report.table().splitlines()))
    return {"model": name, "shape": list(x.shape), "dtype": str(x.dtype), "device": str(dev), "torch_s": t_torch,
            "tracea_s": t_tracea, "ratio": t_torch / t_tracea, "rel_err": rel,
            "fallbacks": [{"op": k, "reason": r, "count": n} for (k, r), n in fb.items()],
            "layers": report.to_dict()["layers"]}


def overhead(device: torch.device, args: argparse.Namespace) -> dict:
    """Host time per call of a small conv (64 channels, 16x16, bias, ReLU; the model's dtype and memory
    format) and a small linear (16x512 @ 512x512, bias): PyTorch vs tracea_torch.ops, eager, no grad."""
    dtype = getattr(torch, args.dtype)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    x = torch.randn(1, 64, 16, 16, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(64, 64, 3, 3, device=device, dtype=dtype).contiguous(memory_format=fmt)
    b = torch.randn(64, device=device, dtype=dtype)
    xl, wl = torch.randn(16, 512, device=device, dtype=dtype), torch.randn(512, 512, device=device, dtype=dtype)
    bl = torch.randn(512, device=device, dtype=dtype)
    reps = max(args.repeats * 20, 200)
    with torch.no_grad():
        t = {"f_conv2d_us": median_time(lambda: F.relu(F.conv2d(x, w, b, 1, 1)), device, 20, reps),
             "tracea_conv2d_us": median_time(lambda: tracea_torch.ops.conv2d(x, w, b, 1, 1, activation="relu"),
                                             device, 20, reps),
             "f_linear_us": median_time(lambda: F.linear(xl, wl, bl), device, 20, reps),
             "tracea_linear_us": median_time(lambda: tracea_torch.ops.linear(xl, wl, bl), device, 20, reps)}
    t = {k: v * 1e6 for k, v in t.items()}
    print(f"\n[overhead] per call ({args.dtype}{', channels_last' if args.channels_last else ''}): conv "
          f"F.conv2d+relu {t['f_conv2d_us']:.1f} us, tracea_torch.ops.conv2d {t['tracea_conv2d_us']:.1f} us; linear "
          f"F.linear {t['f_linear_us']:.1f} us, tracea_torch.ops.linear {t['tracea_linear_us']:.1f} us")
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=32, help="input height and width")
    p.add_argument("--width", type=int, default=32, help="channels of the first stage")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--tune", type=int, default=0, help="graph-tuning iterations per op (0: measure only)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    cnn = resnet_style(args.width).to(device=device, dtype=dtype, memory_format=fmt).eval()
    x = torch.randn(args.batch, 3, args.size, args.size, device=device, dtype=dtype).to(memory_format=fmt)
    results = {"torch": torch.__version__, "tracea_torch": tracea_torch.__version__, "threads": torch.get_num_threads(),
               "runs": [compare("resnet-style", cnn, x, args)]}
    feat = 8 * args.width
    net = mlp(feat).to(device=device, dtype=dtype).eval()
    results["runs"].append(compare("mlp", net, torch.randn(args.batch * 16, feat, device=device, dtype=dtype), args))
    results["overhead"] = overhead(device, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
