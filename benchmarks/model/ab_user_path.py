"""The user path on the held-out shape families, with the performance model (default) against the old
roofline ranking (``TRACEA_PERF_MODEL=0``) and PyTorch, interleaved in one run (GPU).

    source scripts/srcenv.sh && python benchmarks/model/ab_user_path.py [--json out.json] [--budget 150]

For every held-out case of :mod:`shapes` the Doctor decides twice (model on / off). The default call
``tracea.ops.matmul`` / ``tracea.ops.conv2d`` (untuned, back to back between CUDA events, nothing queued
ahead) is timed against PyTorch; where the roofline ranking picks another variant, that variant's
default is timed too (the same call forcing ``variant=``). Kernels are compiled first in parallel.
Ratios: PyTorch time / Tracea time.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shapes  # noqa: E402
from collect_cuda import _compile, sources_of  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "user_path"))
from bench_shapes import b2b  # noqa: E402  (calls back to back between CUDA events, as the user path is timed)


def interleaved(fns, rounds: int = 5) -> list[float]:
    for f in fns:
        f()
    one = max(b2b(f, 1) for f in fns)
    calls = max(3, min(100, int(2e-3 / max(one, 1e-7))))
    acc = [[] for _ in fns]
    for r in range(rounds):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            acc[i].append(b2b(fns[i], calls))
    return [statistics.median(a) for a in acc]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--budget", type=float, default=150.0)
    args = ap.parse_args()
    t0 = time.time()
    os.environ.setdefault("TRACEA_CUDA_CACHE_DIR", "/tmp/tracea-model-cubins")
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.doctor import get_doctor
    from tracea.tuning.cache import TuningCache, set_cache
    from tracea_cuda import testing as T

    set_cache(TuningCache("/tmp/ab-empty-cache.json"))  # untuned: no cache entries
    doctor = get_doctor()
    profile = T.gpu_profile()
    cases = [(f, p, op) for f, p, op in shapes.gemm_cases() + shapes.conv_cases() if shapes.split_of(f) == "heldout"]
    plan = []
    for fam, prec, op in cases:
        os.environ.pop("TRACEA_PERF_MODEL", None)
        on = doctor.decide(op, "cuda:0")
        os.environ["TRACEA_PERF_MODEL"] = "0"
        off = doctor.decide(op, "cuda:0")
        os.environ.pop("TRACEA_PERF_MODEL", None)
        plan.append((fam, prec, op, on.chosen, off.chosen))
    jobs = []
    for _, _, op, on, off in plan:
        jobs += [(on.variant, op, on.config), (off.variant, op, off.config)]
    srcs = sources_of(jobs, profile)
    with cf.ProcessPoolExecutor(max_workers=16, mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile, srcs.values()))
    differ = sum(on.variant.name != off.variant.name for *_, on, off in plan)
    print(f"[{time.time() - t0:5.1f}s] {profile.name}: {len(plan)} held-out cases, rankings differ on {differ}; "
          f"{len(srcs)} kernels compiled", flush=True)
    rows = []
    for fam, prec, op, on, off in plan:
        if time.time() - t0 > args.budget:
            print(f"budget reached after {len(rows)} cases")
            break
        t = T.gemm_inputs(op) if op.kind.value == "gemm" else T.conv_inputs(op)
        tf32 = prec == "fp32-tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if op.kind.value == "gemm":
            a = t["a"].transpose(-1, -2) if op.trans_a else t["a"]
            b = t["b"].transpose(-1, -2) if op.trans_b else t["b"]
            if op.batch == 1:
                a, b = a[0], b[0]
            prec_kw = {"fp32_precision": op.fp32_precision.value} if prec.startswith("fp32") else {}
            ours = lambda a=a, b=b, kw=prec_kw: tracea.ops.matmul(a, b, **kw)  # noqa: E731
            forced = lambda a=a, b=b, kw=prec_kw: tracea.ops.matmul(a, b, variant=off.variant.name, **kw)  # noqa: E731
            theirs = lambda a=a, b=b: a @ b  # noqa: E731
        else:
            x, w = t["x"], t["w"]
            if op.layout.value == "nhwc":
                x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
            kw = dict(stride=op.stride, padding=op.padding)
            pk = {"fp32_precision": op.fp32_precision.value} if prec.startswith("fp32") else {}
            ours = lambda x=x, w=w: tracea.ops.conv2d(x, w, **kw, **pk)  # noqa: E731
            forced = lambda x=x, w=w: tracea.ops.conv2d(x, w, variant=off.variant.name, **kw, **pk)  # noqa: E731
            theirs = lambda x=x, w=w: F.conv2d(x, w, **kw)  # noqa: E731
        same = on.variant.name == off.variant.name
        try:
            times = interleaved([ours, theirs] if same else [ours, theirs, forced])
        except Exception as exc:  # noqa: BLE001
            print(f"  ! {op.describe()}: {exc}", file=sys.stderr)
            continue
        row = {"family": fam, "precision": prec, "op": op.describe(), "model_pick": on.variant.name,
               "roofline_pick": off.variant.name, "tracea_s": times[0], "torch_s": times[1],
               "roofline_pick_s": times[0] if same else times[2], "ratio_model": times[1] / times[0],
               "ratio_roofline": times[1] / (times[0] if same else times[2])}
        rows.append(row)
        print(f"[{time.time() - t0:5.1f}s] {fam:<14} {op.describe():<48} torch/model {row['ratio_model']:5.2f}x  "
              f"torch/roofline {row['ratio_roofline']:5.2f}x  [{on.variant.name.split('.')[-1]}"
              f"{'' if same else ' vs ' + off.variant.name.split('.')[-1]}]", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False

    def gm(xs):
        return statistics.geometric_mean(xs) if xs else float("nan")

    for label, sub in (("all", rows), ("picks differ", [r for r in rows if r["model_pick"] != r["roofline_pick"]])):
        if sub:
            print(f"{label}: {len(sub)} cases; vs PyTorch geomean model {gm([r['ratio_model'] for r in sub]):.2f}x "
                  f"(median {statistics.median(r['ratio_model'] for r in sub):.2f}x, below 0.9x: "
                  f"{sum(r['ratio_model'] < 0.9 for r in sub)}), roofline ranking "
                  f"{gm([r['ratio_roofline'] for r in sub]):.2f}x (below 0.9x: {sum(r['ratio_roofline'] < 0.9 for r in sub)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": profile.name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
