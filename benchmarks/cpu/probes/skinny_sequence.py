"""The skinny GEMM kernels (``ts_f32_call`` / ``ts_bf16_call``, ``tracea_cpu.emit.skinny``) called through
ctypes against ``F.linear`` on a model-like sequence of weights (default: the d512 decoder block's seven
linears), each call timed alone with a ``rms_norm`` between calls, so every weight comes from L3 as in a
forward. Compares thread counts and compile-time variants (``-D`` flags of ``emit/skinny.py``: ``TS_MG``,
``TS_PF``, ``TS_CH``); checks every result against float64 first. Prints per-layer medians and ratios.

    source scripts/srcenv.sh
    python benchmarks/cpu/probes/skinny_sequence.py --m 1,4,16 --threads 1,2 --variants "base=,mg2=-DTS_MG=2"
    python benchmarks/cpu/probes/skinny_sequence.py --dtype bf16 --layers 4096x4096,4096x4096
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F

from tracea.ir.epilogue import Epilogue
from tracea_cpu.emit.skinny import SKINNY_PARAMS, skinny_source
from tracea_cpu.isa import AVX512_BF16
from tracea_cpu.toolchain import build

_P, _L = ctypes.c_void_p, ctypes.c_long


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="base=", help="name=-Dflags,... (flags split on spaces)")
    ap.add_argument("--m", default="1")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--layers", default="512x512,512x512,512x512,512x512,1408x512,1408x512,512x1408",
                    help="NxK weights, called in this order")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=100)
    ns = ap.parse_args()
    bf = ns.dtype == "bf16"
    dt = torch.bfloat16 if bf else torch.float32
    fns = {}
    for item in ns.variants.split(","):
        name, _, flags = item.partition("=")
        lib = build(skinny_source(AVX512_BF16, Epilogue.empty(), True),
                    AVX512_BF16.cflags + tuple(f for f in flags.split() if f), "probe-skinny")
        fn = lib.ts_bf16_call if bf else lib.ts_f32_call
        fn.argtypes, fn.restype = [_P] * 5, ctypes.c_int
        fns[name] = fn
    layers = [tuple(int(v) for v in s.split("x")) for s in ns.layers.split(",")]
    h = torch.randn(1, 512)
    for m in (int(v) for v in ns.m.split(",")):
        ws = [torch.randn(n, k).to(dt) for n, k in layers]
        xs = [torch.randn(m, k).to(dt) for n, k in layers]
        outs = [torch.empty(m, n, dtype=dt) for n, k in layers]
        sides = {"torch": [(lambda w=w, x=x: F.linear(x, w)) for w, x in zip(ws, xs)]}
        for vname, fn in fns.items():
            for nth in (int(t) for t in ns.threads.split(",")):
                calls = []
                for (n, k), w, x, o in zip(layers, ws, xs, outs):
                    p = (_L * len(SKINNY_PARAMS))(1, m, n, k, k, m * k, k, n * k, n, m * n, nth, int(bf))
                    calls.append(lambda p=p, x=x, w=w, o=o, fn=fn: fn(p, x.data_ptr(), w.data_ptr(), o.data_ptr(), None))
                for c, (n, k), w, x, o in zip(calls, layers, ws, xs, outs):
                    c()
                    ref = x.double() @ w.double().T
                    err = float((o.double() - ref).norm() / ref.norm())
                    assert err < (1e-2 if bf else 1e-5), (vname, nth, n, k, err)
                sides[f"{vname}/t{nth}"] = calls
        names = list(sides)
        per = {nm: [[] for _ in layers] for nm in names}
        tot: dict[str, list[float]] = {nm: [] for nm in names}
        for r in range(ns.rounds):
            for nm in names[r % len(names):] + names[:r % len(names)]:
                t_all = 0.0
                for li, c in enumerate(sides[nm]):
                    F.rms_norm(h, (512,))
                    t0 = time.perf_counter()
                    c()
                    d = time.perf_counter() - t0
                    per[nm][li].append(d)
                    t_all += d
                tot[nm].append(t_all)
        base = statistics.median(tot["torch"])
        print(f"M={m} {ns.dtype} layers {ns.layers}")
        for nm in names:
            t = statistics.median(tot[nm])
            layer_us = " ".join(f"{statistics.median(v) * 1e6:6.1f}" for v in per[nm])
            print(f"  {nm:22s} sum {t * 1e6:8.1f} us  torch/this {base / t:5.2f}   per layer (us): {layer_us}", flush=True)


if __name__ == "__main__":
    main()
