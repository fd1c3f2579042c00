"""The widened-bf16 skinny kernel (``ts_bw_call``, ``cpu.gemv.bf16cvt.<isa>``: bf16 widened to fp32 in
registers, for CPUs without AVX512_BF16) against torch's bf16 ``F.linear``, and the user path
(``tracea_torch.ops.linear``), on decode-sized linears. Each result is checked against float64 first;
then the sides are called interleaved (rotating order each round), each call timed alone; prints
medians, the weight's GB/s and torch/this ratios. ``--variants`` compiles kernel variants with ``-D``
flags of ``emit/skinny.py`` (``TS_MG``, ``TS_CH``, ``TS_PF``).

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/gemv_bf16cvt.py --m 1,4,8,16 \\
        --layers 4096x4096,11008x4096,4096x11008,512x512
    python benchmarks/cpu/probes/gemv_bf16cvt.py --variants "mg4=,mg2=-DTS_MG=2" --no-user
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
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.skinny import auto_threads
from tracea_cpu.toolchain import build

_P, _L = ctypes.c_void_p, ctypes.c_long


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default="avx2", choices=["avx2", "avx512"])
    ap.add_argument("--variants", default="kernel=", help="name=-Dflags,... (flags split on spaces)")
    ap.add_argument("--m", default="1,4,8,16")
    ap.add_argument("--layers", default="4096x4096,11008x4096,4096x11008,512x512", help="NxK weights")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (0: the variant's rule)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-user", action="store_true", help="skip tracea_torch.ops.linear")
    ns = ap.parse_args()
    isa = ISA_BY_NAME[ns.isa]
    fns = {}
    for item in ns.variants.split(","):
        name, _, flags = item.partition("=")
        lib = build(skinny_source(isa, Epilogue.empty(), False, True),
                    isa.cflags + tuple(f for f in flags.split() if f), "probe-skinny-bw")
        fn = lib.ts_bw_call
        fn.argtypes, fn.restype = [_P] * 5, ctypes.c_int
        fns[name] = fn
    linear = None
    if not ns.no_user:
        from tracea_torch.ops import linear
    cores = torch.get_num_threads()
    print(f"torch {torch.__version__}, {cores} threads; kernel threads "
          f"{ns.threads or 'auto'}; rounds {ns.rounds}", flush=True)
    for n, k in (tuple(int(v) for v in s.split("x")) for s in ns.layers.split(",")):
        w = torch.randn(n, k).bfloat16()
        for m in (int(v) for v in ns.m.split(",")):
            x = torch.randn(m, k).bfloat16()
            ref = x.double() @ w.double().T
            sides = {"torch": lambda x=x, w=w: F.linear(x, w)}
            nth = ns.threads or auto_threads(n * k * 2, cores)
            for vname, fn in fns.items():
                o = torch.empty(m, n, dtype=torch.bfloat16)
                p = (_L * len(SKINNY_PARAMS))(1, m, n, k, k, m * k, k, n * k, n, m * n, nth, 1)
                sides[vname] = lambda p=p, x=x, w=w, o=o, fn=fn: fn(p, x.data_ptr(), w.data_ptr(), o.data_ptr(), None)
                sides[vname]()
                err = float((o.double() - ref).norm() / ref.norm())
                assert err < 1e-2, (vname, m, n, k, err)
            if linear is not None:
                sides["ops.linear"] = lambda x=x, w=w: linear(x, w)
                err = float((sides["ops.linear"]().double() - ref).norm() / ref.norm())
                assert err < 1e-2, ("ops.linear", m, n, k, err)
            names = list(sides)
            times: dict[str, list[float]] = {nm: [] for nm in names}
            for r in range(ns.rounds):
                for nm in names[r % len(names):] + names[:r % len(names)]:
                    t0 = time.perf_counter()
                    sides[nm]()
                    times[nm].append(time.perf_counter() - t0)
            base = statistics.median(times["torch"])
            row = []
            for nm in names:
                t = statistics.median(times[nm])
                row.append(f"{nm} {t * 1e3:7.3f} ms {n * k * 2 / t / 1e9:5.1f} GB/s x{base / t:5.2f}")
            print(f"M={m:2d} {n}x{k}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
