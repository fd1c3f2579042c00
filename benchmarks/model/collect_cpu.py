"""Measure every applicable fp32 CPU variant's default config (the first valid hero, what an untuned call
runs) on the CPU shape families of :mod:`shapes`, plus NumPy (GEMM) / torch (conv2d) on the same shapes,
and write a raw performance-model data file for this CPU's family (``pack_data.py`` turns it into the
shipped ``tracea_cpu/perf_data/<arch>.json``).

    source scripts/srcenv.sh
    OMP_WAIT_POLICY=passive python benchmarks/model/collect_cpu.py --out raw.json [--budget 600] [--heroes]

Variants of one shape are timed interleaved (round robin, the bound launcher the plan cache would use,
``perf_counter``), medians; the anchor joins the rounds. ``--heroes`` also times every hero config of the
widest ISA's GEMM / conv variant and prints which is fastest per shape (how the per-microarchitecture
hero orders in ``tracea_cpu.spaces`` were chosen). Nothing is written to the tuning cache.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import json
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shapes  # noqa: E402


def rounds_for(seconds: float) -> int:
    return int(min(15, max(3, 0.25 / max(seconds, 1e-6))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--heroes", action="store_true")
    ap.add_argument("--max-scalar-flops", type=float, default=3e8)
    args = ap.parse_args()
    t0 = time.time()

    import torch
    import torch.nn.functional as F

    from tracea.doctor import get_doctor
    from tracea.perfmodel import arch_key
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.tuning.inputs import random_host_inputs

    doctor = get_doctor()
    profile = doctor.profile_for("cpu")
    variants = [v for v in doctor.registry if v.device_kind == "cpu" and v.backend == "cpu"]
    adapter = NumpyAdapter()
    cases = shapes.gemm_cases(gpu=False) + shapes.conv_cases(gpu=False)
    random.Random(0).shuffle(cases)
    data = {"format": "tracea-perf-data-raw", "backend": "cpu", "arch_key": arch_key(profile),
            "profile": profile.to_dict(), "anchor_name": f"numpy {np.__version__} (gemm) / torch {torch.__version__} (conv2d)",
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "load_average_start": list(os.getloadavg()),
            "method": "bound launchers of the default configs, timed interleaved with perf_counter (round robin), "
                      "median; anchor in the same rounds",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "records": [], "torch_s": [],
            "heroes": []}
    print(f"{profile.name} ({data['arch_key']}), {profile.compute_units} cores, load {os.getloadavg()}", flush=True)
    stopped = ""
    for i, (fam, prec, op) in enumerate(cases):
        if time.time() - t0 > args.budget:
            stopped = f"budget reached after {i} of {len(cases)} cases"
            break
        host = random_host_inputs(op, np.random.default_rng(i))
        out = np.empty(op.out_shape if hasattr(op, "out_shape") else (op.batch, op.m, op.n), np.float32)
        roles = op.roles
        ins = tuple(host.get(r) for r in roles)
        fns: dict[str, object] = {}
        meta = {}
        for v in variants:
            if v.op_kind is not op.kind or doctor.check(v, op, profile):
                continue
            if v.isa.name == "scalar" and op.flops > args.max_scalar_flops:
                continue
            found = doctor.default_config(v, op, profile)
            if isinstance(found, str):
                continue
            cfg = found[0]
            configs = [(v.name, cfg, found[1])]
            if args.heroes and v.isa.name == profile.extras.get("best_isa"):
                configs += [(f"{v.name}#hero{j}", h, "hero") for j, h in enumerate(doctor.hero_configs(v, op, profile))
                            if h != cfg and v.validate_config(op, h, profile)]
            for label, c, src in configs:
                try:
                    v.prepare(op, c, profile)
                    launch = v.bind(op, c, profile, adapter)
                except Exception as exc:  # noqa: BLE001
                    print(f"  ! {label} {op.describe()}: {exc}", file=sys.stderr)
                    continue
                fns[label] = (lambda launch=launch: launch(*ins, out))
                meta[label] = (v, c, src)
        if op.kind.value == "gemm":
            a, b = host["a"], host["b"]
            a2 = np.swapaxes(a, -1, -2) if op.trans_a else a
            b2 = np.swapaxes(b, -1, -2) if op.trans_b else b
            if op.batch == 1:
                a2, b2 = a2[0] if a2.ndim == 3 else a2, b2[0] if b2.ndim == 3 else b2
            fns["anchor"] = lambda: a2 @ b2
        else:
            xt, wt = torch.from_numpy(host["x"]), torch.from_numpy(host["w"])
            fns["anchor"] = lambda: F.conv2d(xt, wt, stride=op.stride, padding=op.padding)
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            for fn in fns.values():
                fn()
            first = time.perf_counter()
            for fn in fns.values():
                fn()
            n = rounds_for((time.perf_counter() - first) / len(fns))
            for r in range(n):
                keys = list(fns) if r % 2 == 0 else list(reversed(fns))
                for k in keys:
                    t = time.perf_counter()
                    fns[k]()
                    times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(ts) for k, ts in times.items()}
        for label, (v, c, src) in meta.items():
            rec = {"variant": v.name, "op": op.to_dict(), "config": c.key, "config_source": src, "family": fam,
                   "precision": prec, "split": shapes.split_of(fam), "seconds": med[label]}
            (data["heroes"] if "#" in label else data["records"]).append(dict(rec, label=label) if "#" in label else rec)
        data["torch_s"].append({"op": op.to_dict(), "seconds": med["anchor"], "family": fam, "precision": prec,
                                "split": shapes.split_of(fam)})
        line = " ".join(f"{k.split('.')[-1]}={s * 1e3:.3g}ms" for k, s in med.items())
        print(f"[{time.time() - t0:5.0f}s] {i:3d} {fam:<14} {op.describe():<44} {line}", flush=True)
        if i % 10 == 0:
            with open(args.out, "w") as f:
                json.dump(data, f)
    data["stopped"] = stopped
    data["load_average_end"] = list(os.getloadavg())
    with open(args.out, "w") as f:
        json.dump(data, f)
    print(f"wrote {len(data['records'])} records" + (f"; {stopped}" if stopped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
