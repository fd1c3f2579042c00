"""Measure every applicable CUDA variant's default config (the first valid hero, as the Doctor runs an
untuned op) on the shape families of :mod:`shapes`, plus PyTorch's time on the same shapes, and write
the performance-model data file (one device call).

    source scripts/srcenv.sh && python benchmarks/model/collect_cuda.py --out $OUT/sm_90.json [--budget 200]
        [--ms 32,64,96] [--convs 1x1]

Kernels are compiled first, in parallel worker processes (NVRTC, into the on-disk module cache), so
the timed phase never waits on a compiler. Tracea's times come from ``tracea_cuda.measure.measure``
(CUDA events, the launches queued behind a spin kernel: isolated kernel time, median); PyTorch's from
the same event pattern behind ``torch.cuda._sleep``. Cases run in a seeded random order, so a run cut by
``--budget`` still covers every family; the file is rewritten as cases complete.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shapes  # noqa: E402


def _compile(item: tuple[str, str, str]) -> str:
    """Worker: compile one kernel into the disk cache (no CUDA context needed)."""
    from tracea_cuda import compiler  # noqa: PLC0415

    return "compiled" if compiler.precompile(*item) else "hit"


class _Found(Exception):
    pass


def sources_of(jobs, profile) -> dict:
    """(source, name, arch) of every kernel ``preload`` would compile for ``jobs`` (first one per job, plus
    the helper kernels), collected without compiling."""
    from tracea_cuda import compiler, measure  # noqa: PLC0415

    real, found = compiler.load, {}

    def record(source, name, arch, *, smem, threads):
        found[compiler.cache_key(source, compiler.options_for(arch), arch)] = (source, name, arch)
        raise _Found

    compiler.load = record
    try:
        for variant, op, cfg in jobs:
            try:
                variant.preload(op, cfg, profile)
            except _Found:
                pass
            except Exception as exc:  # noqa: BLE001 - reported, the case is timed (and fails) later
                print(f"  ! enumerate {variant.name} {op.describe()}: {exc}", file=sys.stderr)
        try:
            measure.queue_ahead(None, 1, "sm_90a")
        except _Found:
            pass
    finally:
        compiler.load = real
    return found


def torch_fn(op, t):
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from tracea.ir.ops import GemmOp, Layout  # noqa: PLC0415

    if isinstance(op, GemmOp):
        a = t["a"].transpose(-1, -2) if op.trans_a else t["a"]
        b = t["b"].transpose(-1, -2) if op.trans_b else t["b"]
        if op.batch == 1:
            a, b = a[0], b[0]
        return lambda: torch.matmul(a, b)
    x, w = t["x"], t["w"]
    if op.layout is Layout.NHWC:
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    return lambda: F.conv2d(x, w, stride=op.stride, padding=op.padding)


def time_torch(fn, reps: int) -> float:
    import torch  # noqa: PLC0415

    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000 + 60_000 * reps)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) / 1e3


def reps_for(seconds: float) -> int:
    return int(min(15, max(3, 0.03 / max(seconds, 1e-7))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--limit", type=int, default=0, help="at most this many cases (0: all)")
    ap.add_argument("--ms", default="", help="only the GEMM cases of these M (e.g. 32,64,96: a refresh that "
                                             "pack_data.py --merge adds to a shipped file)")
    ap.add_argument("--convs", choices=("all", "1x1"), default="",
                    help="only conv cases (1x1: only the 1x1 stride-1 ones), e.g. a refresh merged into a shipped file")
    args = ap.parse_args()
    t0 = time.time()
    os.environ.setdefault("TRACEA_CUDA_CACHE_DIR", "/tmp/tracea-model-cubins")

    import torch  # noqa: PLC0415
    from tracea.doctor import get_doctor  # noqa: PLC0415
    from tracea_cuda import measure  # noqa: PLC0415
    from tracea_cuda import testing as T  # noqa: PLC0415
    from tracea_cuda.variants import all_variants  # noqa: PLC0415

    profile = T.gpu_profile()
    doctor = get_doctor()
    variants = all_variants()
    cases = [(f, p, op) for f, p, op in shapes.gemm_cases() + shapes.conv_cases()]
    if args.ms:
        ms = {int(v) for v in args.ms.split(",")}
        cases = [(f, p, op) for f, p, op in cases if op.kind.value == "gemm" and op.m in ms]
    if args.convs:
        cases = [(f, p, op) for f, p, op in cases if op.kind.value == "conv2d"
                 and (args.convs == "all" or ((op.r, op.s) == (1, 1) and tuple(op.stride) == (1, 1)))]
    random.Random(0).shuffle(cases)
    if args.limit:
        cases = cases[:args.limit]
    plan = []  # (family, precision, op, [(variant, config, source)])
    for fam, prec, op in cases:
        runs = []
        for v in variants:
            if v.op_kind is not op.kind or v.check(op, profile):
                continue
            found = doctor.default_config(v, op, profile)
            if isinstance(found, str):
                continue
            runs.append((v, found[0], found[1]))
        plan.append((fam, prec, op, runs))
    jobs = [(v, op, cfg) for _, _, op, runs in plan for v, cfg, _ in runs]
    srcs = sources_of(jobs, profile)
    print(f"[{time.time() - t0:5.1f}s] {len(plan)} cases, {len(jobs)} variant runs, {len(srcs)} kernels to compile",
          flush=True)
    done = {"compiled": 0, "hit": 0, "failed": 0}
    with cf.ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4), mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_compile, s) for s in srcs.values()]):
            try:
                done[fut.result()] += 1
            except Exception as exc:  # noqa: BLE001
                done["failed"] += 1
                print(f"  ! compile: {str(exc)[:200]}", file=sys.stderr)
    print(f"[{time.time() - t0:5.1f}s] compile: {done}", flush=True)

    data = {"format": "tracea-perf-data", "version": 1, "backend": "cuda",
            "arch_key": f"sm_{profile.compute_capability[0]}{profile.compute_capability[1]}",
            "profile": profile.to_dict(), "torch": torch.__version__,
            "method": "tracea_cuda.measure.measure (CUDA events queued behind a spin kernel), median; default "
                      "config = Doctor.default_config (first valid hero); torch timed the same way "
                      "(cuBLAS/cuDNN, TF32 per the op's fp32_precision)",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "records": [], "torch_s": []}

    def flush() -> None:
        with open(args.out, "w") as f:
            json.dump(data, f, indent=0)

    stopped = ""
    for i, (fam, prec, op, runs) in enumerate(plan):
        if time.time() - t0 > args.budget:
            stopped = f"budget reached after {i} of {len(plan)} cases"
            break
        try:
            t = T.gemm_inputs(op) if op.kind.value == "gemm" else T.conv_inputs(op)
        except Exception as exc:  # noqa: BLE001
            print(f"  ! inputs {op.describe()}: {exc}", file=sys.stderr)
            continue
        tf32 = getattr(op, "fp32_precision", None) is not None and op.fp32_precision.value != "highest"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        ref = None
        try:
            fn = torch_fn(op, t)
            ref = fn().float()
            tt = time_torch(fn, reps_for(time_torch(fn, 2)))
            data["torch_s"].append({"op": op.to_dict(), "seconds": tt, "family": fam, "precision": prec,
                                    "split": shapes.split_of(fam)})
        except Exception as exc:  # noqa: BLE001
            print(f"  ! torch {op.describe()}: {exc}", file=sys.stderr)
        args_ = T.op_args(t)
        line = []
        for v, cfg, source in runs:
            rec = {"variant": v.name, "op": op.to_dict(), "config": cfg.key, "config_source": source,
                   "family": fam, "precision": prec, "split": shapes.split_of(fam)}
            try:
                first = statistics.median(measure.measure(v, op, cfg, args_, profile, 1, 2))
                secs = measure.measure(v, op, cfg, args_, profile, 1, reps_for(first))
                rec["seconds"] = statistics.median(secs)
                if ref is not None:
                    out = t["out"].float()
                    if op.kind.value == "gemm" and op.batch == 1:
                        out = out[0]
                    elif op.kind.value == "conv2d" and op.layout.value == "nhwc":
                        out = out.permute(0, 3, 1, 2)
                    rec["rel_err_vs_torch"] = float(((out - ref).norm() / ref.norm().clamp_min(1e-30)).item())
            except Exception as exc:  # noqa: BLE001 - recorded: the variant failed on this op
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            data["records"].append(rec)
            line.append(f"{v.name.split('.')[-1]}={rec.get('seconds', float('nan')) * 1e6:.0f}us")
        print(f"[{time.time() - t0:5.1f}s] {i:3d} {fam:<14} {op.describe():<48} torch="
              f"{data['torch_s'][-1]['seconds'] * 1e6 if data['torch_s'] else 0:.0f}us {' '.join(line)}", flush=True)
        del t, args_, ref
        if i % 20 == 0:
            flush()
    data["stopped"] = stopped
    flush()
    print(f"[{time.time() - t0:5.1f}s] wrote {len(data['records'])} records, {len(data['torch_s'])} torch rows"
          + (f"; {stopped}" if stopped else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
