"""Which blocked-GEMM config should be the untuned default on this CPU: every candidate config and NumPy,
timed interleaved (round robin, medians) on square fp32 GEMMs, through the bound launcher the user path
runs. Prints GFLOP/s and the ratio to NumPy per config and size, and the geometric mean over sizes.

    source scripts/srcenv.sh
    OMP_WAIT_POLICY=passive python benchmarks/cpu/probes/hero_study.py [--sizes 512,1024,512x4096x4096] [--rounds 9]
        [--configs 6x16:mc72:nc4080:kc256,4x24:mc48:nc4080:kc512]

``--configs``: the candidates to time instead of the built-in AVX-512 list (``MRxNR:mcM:ncN:kcK``, comma
separated); configs the variant rejects on this machine are skipped.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import statistics
import time

import numpy as np

from tracea.doctor import get_doctor
from tracea.ir.ops import GemmOp
from tracea.runtime.arrays import NumpyAdapter
from tracea.semantic import PipelineConfig

CANDIDATES = [dict(mr=6, nr=64, mc=48, nc=4096, kc=1024), dict(mr=14, nr=32, mc=28, nc=4096, kc=1024),
              dict(mr=8, nr=48, mc=32, nc=4080, kc=1024), dict(mr=12, nr=32, mc=24, nc=4096, kc=1024),
              dict(mr=4, nr=64, mc=72, nc=2048, kc=384),
              dict(mr=6, nr=64, mc=96, nc=4096, kc=512), dict(mr=6, nr=64, mc=192, nc=4096, kc=384),
              dict(mr=14, nr=32, mc=112, nc=4096, kc=512), dict(mr=14, nr=32, mc=56, nc=4096, kc=1024),
              dict(mr=8, nr=48, mc=96, nc=4080, kc=512), dict(mr=12, nr=32, mc=96, nc=4096, kc=512)]


def parse_configs(text: str) -> list[dict[str, int]]:
    """``MRxNR:mcM:ncN:kcK,...`` -> config dicts (nc defaults to 4096)."""
    out = []
    for item in text.split(","):
        tile, *rest = item.strip().split(":")
        mr, nr = (int(x) for x in tile.split("x"))
        cfg = dict(mr=mr, nr=nr, mc=48, nc=4096, kc=512)
        for part in rest:
            key = part.rstrip("0123456789")
            cfg[key] = int(part[len(key):])
        out.append(cfg)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,768,1024,1536,2048")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--configs", default="")
    args = ap.parse_args()
    candidates = parse_configs(args.configs) if args.configs else CANDIDATES
    doctor = get_doctor()
    prof = doctor.profile_for("cpu")
    v = doctor.registry.get(f"cpu.gemm.{prof.extras.get('best_isa')}")
    print(f"{prof.name} ({prof.extras.get('microarch')}), load {os.getloadavg()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; variant {v.name}")
    adapter = NumpyAdapter()
    ratios: dict[str, list[float]] = {}
    for size in args.sizes.split(","):
        dims = tuple(int(x) for x in size.split("x")) if "x" in size else (int(size),) * 3
        op = GemmOp(*dims)
        rng = np.random.default_rng(sum(dims))
        a = rng.standard_normal((dims[0], dims[2]), dtype=np.float32)
        b = rng.standard_normal((dims[2], dims[1]), dtype=np.float32)
        out = np.empty(dims[:2], np.float32)
        fns = {"numpy": lambda: a @ b}
        for c in candidates:
            cfg = PipelineConfig(params=tuple(dict(c, threads=0).items()))
            if not v.validate_config(op, cfg, prof):
                continue
            launch = v.bind(op, cfg, prof, adapter)
            fns[f"{c['mr']}x{c['nr']} mc{c['mc']} nc{c['nc']} kc{c['kc']}"] = lambda launch=launch: launch(a, b, None, out)
        for f in fns.values():
            f()
        times = {k: [] for k in fns}
        for r in range(args.rounds):
            keys = list(fns) if r % 2 == 0 else list(reversed(fns))
            for k in keys:
                t = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(ts) for k, ts in times.items()}
        fl = 2 * dims[0] * dims[1] * dims[2]
        print(f"{size}: numpy {fl / med['numpy'] / 1e9:.0f} GFLOP/s; " + ", ".join(
            f"{k} {fl / t / 1e9:.0f} ({med['numpy'] / t:.2f}x)" for k, t in sorted(med.items(), key=lambda kv: kv[1])
            if k != "numpy"), flush=True)
        for k, t in med.items():
            if k != "numpy":
                ratios.setdefault(k, []).append(med["numpy"] / t)
    print("geomean ratio to NumPy over sizes:")
    for k, rs in sorted(ratios.items(), key=lambda kv: -statistics.geometric_mean(kv[1])):
        print(f"  {k:<24} {statistics.geometric_mean(rs):.3f}x  (min {min(rs):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
