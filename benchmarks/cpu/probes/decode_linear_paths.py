"""Where a patched decoder block's one-token decode spends its linear-layer time, inside the forward.

Four copies of the CPU decoder block of ``bench_user_path.py`` (d512, fp32 by default), forwards
interleaved round-robin, each ``nn.Linear`` call timed inside the forward:

* ``eager``: unpatched (PyTorch's ``F.linear``);
* ``patched``: ``tracea_torch.patch_linear`` with the arbiter off (Tracea's skinny kernel serves every
  linear through the patched layer's full path: signature checks, plan, launcher);
* ``checks+raw``: patched, but each layer's remembered plan replaced by a minimal one (``torch.empty`` and
  the ctypes call of ``ts_f32_call``): the patched layer's checks without Tracea's plan/launcher frames;
* ``raw``: each layer's ``forward`` replaced by that minimal call: the kernel with the least Python.

The per-layer differences separate the kernel (``raw`` vs ``eager``) from the Python path (``patched`` /
``checks+raw`` vs ``raw``). Prints per-layer medians, the sums and the whole forwards.

    source scripts/srcenv.sh
    python benchmarks/cpu/probes/decode_linear_paths.py [--threads 2] [--rounds 300]
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "user_path"))
os.environ["TRACEA_ARBITER"] = "0"

import tracea_torch  # noqa: E402
from bench_user_path import DecoderBlock  # noqa: E402
from tracea_cpu import kernels  # noqa: E402
from tracea_cpu.emit.skinny import SKINNY_PARAMS  # noqa: E402


def minimal_call(fn, mod: nn.Linear, nth: int):  # noqa: ANN001, ANN201
    n, k = mod.weight.shape
    p = (ctypes.c_long * len(SKINNY_PARAMS))(1, 1, n, k, k, k, k, n * k, n, n, nth, 0)

    def call(x: torch.Tensor, *_: object) -> torch.Tensor:
        out = torch.empty((*x.shape[:-1], n))
        fn(p, x.data_ptr(), mod.weight.data_ptr(), out.data_ptr(), None)
        return out
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2, help="threads of the minimal calls")
    ap.add_argument("--rounds", type=int, default=300)
    ns = ap.parse_args()
    fn = kernels.skinny_library("avx512", "none").ts_f32_call
    torch.manual_seed(0)
    blk = DecoderBlock(512, 8, 1408).eval()
    x = torch.randn(1, 1, 512)
    pat = copy.deepcopy(blk)
    tracea_torch.patch_linear(pat)
    mid = copy.deepcopy(blk)
    tracea_torch.patch_linear(mid)
    raw = copy.deepcopy(blk)
    with torch.no_grad():
        pat(x)
        mid(x)
    for mod in mid.modules():
        if isinstance(mod, nn.Linear):
            mod.__dict__["_tracea_memo"].plan = minimal_call(fn, mod, ns.threads)
    for mod in raw.modules():
        if isinstance(mod, nn.Linear):
            mod.forward = minimal_call(fn, mod, ns.threads)
    models = {"eager": blk, "patched": pat, "checks+raw": mid, "raw": raw}
    times: dict[tuple[str, str], list[float]] = {}
    for tag, model in models.items():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear):
                f, key = mod.forward, (tag, name)
                times[key] = []

                def timed(inp: torch.Tensor, f=f, key=key) -> torch.Tensor:  # noqa: ANN001
                    t0 = time.perf_counter()
                    out = f(inp)
                    times[key].append(time.perf_counter() - t0)
                    return out
                mod.forward = timed
    tot: dict[str, list[float]] = {t: [] for t in models}
    names = list(models)
    with torch.no_grad():
        ref = blk(x)
        for t, m in models.items():
            for _ in range(5):
                out = m(x)
            assert float((out - ref).norm() / ref.norm()) < 1e-5, t
        for v in times.values():
            v.clear()
        for r in range(ns.rounds):
            for t in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                models[t](x)
                tot[t].append(time.perf_counter() - t0)
    layers = [n for (t, n) in times if t == "eager"]
    print("per linear (us): " + "  ".join(f"{n:>6s}" for n in layers))
    for t in models:
        print(f"  {t:10s}      " + "  ".join(f"{statistics.median(times[(t, n)]) * 1e6:6.1f}" for n in layers))
    e = statistics.median(tot["eager"])
    for t in models:
        s = sum(statistics.median(times[(t, n)]) for n in layers)
        m = statistics.median(tot[t])
        print(f"{t:10s} forward {m * 1e6:7.1f} us (eager/this {e / m:4.2f})  linears {s * 1e6:6.1f}  rest {(m - s) * 1e6:6.1f}")


if __name__ == "__main__":
    main()
