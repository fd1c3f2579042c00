"""Patch a ResNet-style model, tune it, compare outputs and speed against PyTorch.

    source scripts/srcenv.sh && python packages/tracea-torch/examples/resnet_demo.py [--device cuda] [--iterations 20]

Runs on whatever backends are installed (the CPU backend here, CUDA on a GPU); layers no Tracea kernel
serves run on PyTorch and are listed with the reason.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

import tracea_torch
from tracea_torch.models import BasicBlock as Block


def model(width: int = 32, classes: int = 10) -> nn.Module:
    w = width
    return nn.Sequential(nn.Conv2d(3, w, 3, 1, 1), nn.ReLU(), Block(w, w), Block(w, 2 * w, 2),
                         Block(2 * w, 4 * w, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * w, 64), nn.ReLU(), nn.Linear(64, classes))


def median_ms(fn, device: torch.device, n: int = 10) -> float:
    fn()
    times = []
    for _ in range(n):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--iterations", type=int, default=12, help="graph tuning budget (trials in total)")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    net = model().to(device).eval()
    x = torch.randn(args.batch, 3, 32, 32, device=device)

    plain = copy.deepcopy(net)
    print(tracea_torch.tune(net, x, iterations=args.iterations))          # 1. tune every layer shape as one graph

    tracea_torch.patch_conv2d(net)                                       # 2. patch (reversible)
    tracea_torch.patch_linear(net)
    tracea_torch.fallbacks.reset()
    with torch.no_grad():
        ref, out = plain(x), net(x)
        report = tracea_torch.fallbacks.report()                          # what one forward pass left to PyTorch
        rel = float((out - ref).norm() / ref.norm())
        t_torch, t_tracea = median_ms(lambda: plain(x), device), median_ms(lambda: net(x), device)
    print(f"\noutputs: relative difference {rel:.2e}")                     # 3. compare outputs and speed
    print(f"whole model: PyTorch {t_torch:.3f} ms, Tracea {t_tracea:.3f} ms ({t_torch / t_tracea:.2f}x)")
    print("fell back to PyTorch in one forward pass:\n" + report if report else "no layer fell back to PyTorch")
    tracea_torch.unpatch_conv2d(net)
    tracea_torch.unpatch_linear(net)


if __name__ == "__main__":
    main()
