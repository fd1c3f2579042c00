"""Benchmark of the tracea-cpu backend against NumPy (OpenBLAS) and torch CPU (oneDNN / SDPA), side by
side in one run, with this machine's measured FMA peak.

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/bench_cpu.py [--quick] [--json out.json]
        [--only gemm,linear,gemm-bf16,conv,attention] [--tune N] [--threads T] [--conv-3x3-only]

Prints GFLOP/s, ratios against the anchors measured in the same run and the fraction of the FMA peak;
writes every row to JSON. ``--tune N`` tries N configs of the variant's search space per problem
(plus the hero configs) and reports the best, so the figures show what the tuner can reach.
"""

from __future__ import annotations

import os

# OpenBLAS worker threads busy-wait ~2^28 cycles after every call by default; interleaved with other
# libraries on a 2-core machine that spinning steals the cores of whatever runs next. Keep it short
# (must be set before NumPy loads OpenBLAS).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import math
import json
import platform
import random
import sys
import time

import numpy as np

from tracea.doctor.host_plugin import host_profile
from tracea.doctor.variant import OpArgs
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea.runtime.arrays import NumpyAdapter
from tracea_cpu.emit.peak import bf16_peak_source, peak_source
from tracea_cpu.isa import AVX512_BF16, ISA_BY_NAME
from tracea_cpu.kernels import thread_count
from tracea_cpu.testing import attention_ref, conv2d_ref, rel_err
from tracea_cpu.toolchain import build
from tracea_cpu.variants import CpuAttentionVariant, CpuConv2dVariant, CpuGemmVariant

PROFILE = host_profile()


def compare(fns: dict, min_rounds=7, budget=2.0) -> dict:
    """Interleaved timing of several callables (A B C A B C ...), so load from other processes on a
    shared machine hits all of them alike. Returns name -> (best, median) wall seconds."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (time.perf_counter() - start < budget and rounds < 100):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        rounds += 1
    return {name: (float(np.min(ts)), float(np.median(ts))) for name, ts in times.items()}


def measure_peak(isa_name: str, threads: int) -> float:
    import ctypes

    isa = ISA_BY_NAME[isa_name]
    lib = build(peak_source(isa), isa.cflags, f"peak-{isa_name}")
    lib.tr_fma_peak.argtypes = [ctypes.c_long, ctypes.c_int]
    lib.tr_fma_peak.restype = ctypes.c_double
    per_iter = lib.tr_fma_per_iter()
    iters = 2_000_000
    best = 0.0
    for _ in range(15):
        t = time.perf_counter()
        lib.tr_fma_peak(iters, threads)
        dt = time.perf_counter() - t
        best = max(best, per_iter * iters * threads / dt / 1e9)
    return best


def measure_bf16_peak(threads: int) -> float:
    """The ``vdpbf16ps`` peak (GFLOP/s, 2 flops per bf16 product) of ``threads`` threads, measured like
    the fp32 peak: the best of 15 runs of a register-only loop."""
    import ctypes

    lib = build(bf16_peak_source(ISA_BY_NAME["avx512"]), AVX512_BF16.cflags, "peak-bf16")
    lib.tr_bf16_peak.argtypes = [ctypes.c_long, ctypes.c_int]
    lib.tr_bf16_peak.restype = ctypes.c_double
    per_iter, iters, best = lib.tr_bf16_per_iter(), 2_000_000, 0.0
    for _ in range(15):
        t = time.perf_counter()
        lib.tr_bf16_peak(iters, threads)
        best = max(best, per_iter * iters * threads / (time.perf_counter() - t) / 1e9)
    return best


def best_isa() -> str:
    for name in ("avx512", "avx2", "neon", "scalar"):
        isa = ISA_BY_NAME[name]
        if isa.runs_here() and PROFILE.has(*isa.requires):
            return name
    return "scalar"


def pick_config(variant, op, args, tune: int, seed: int = 0):
    """The hero (and, with ``tune``, search-space) config with the lowest *median* time, all candidates
    timed interleaved in the same rounds so a burst of load from other jobs hits every one alike."""
    candidates = list(variant.hero_configs(op, PROFILE))
    if tune:
        space = list(variant.search_space(op, PROFILE))
        random.Random(seed).shuffle(space)
        candidates += space[:tune]
    candidates = list(dict.fromkeys(c for c in candidates if variant.validate_config(op, c, PROFILE)))
    for cfg in candidates:
        variant.prepare(op, cfg, PROFILE)
    fns = {i: (lambda cfg=cfg: variant.run(op, cfg, args, PROFILE)) for i, cfg in enumerate(candidates)}
    times = compare(fns, min_rounds=5, budget=0.15 * len(fns))
    return candidates[min(times, key=lambda i: times[i][1])]


def torch_mod(threads: int):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def _report(kind, label, op, timings, peak, cfg, err, extra, rows):
    """One result row: GFLOP/s from the best (and median) interleaved times, ratios vs the anchors."""
    ours_best, ours_med = timings.pop("tracea")
    row = dict(kind=kind, **extra, tracea=op.flops / ours_best / 1e9, tracea_median=op.flops / ours_med / 1e9,
               frac_peak=op.flops / ours_best / 1e9 / peak, rel_err=err, config=dict(cfg.params))
    for name, (best, med) in timings.items():
        row[name] = op.flops / best / 1e9
        row[name + "_median"] = op.flops / med / 1e9
        row["vs_" + name] = best / ours_best
    rows.append(row)
    cells = " ".join(f"{row[n]:8.1f} {row['vs_' + n]:6.2f}x" for n in timings)
    print(f"{label:>28} {row['tracea']:8.1f} {cells} {100 * row['frac_peak']:6.1f}%  {_cfg(cfg)}  {_err(err)}")
    return row


def bench_gemm(isa, sizes, tune, torch, peak, rows):
    print(f"\nGEMM fp32 (C = A @ B), {isa}; GFLOP/s (best of interleaved runs), ratio = anchor time / ours")
    print(f"{'size':>28} {'tracea':>8} {'numpy':>8} {'ratio':>7} {'torch':>8} {'ratio':>7} {'% peak':>7}  config")
    variant = CpuGemmVariant(ISA_BY_NAME[isa])
    rng = np.random.default_rng(0)
    for n in sizes:
        op = GemmOp(n, n, n)
        a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        out = np.empty((n, n), np.float32)
        out_np = np.empty((n, n), np.float32)
        args = OpArgs({"a": a, "b": b, "bias": None}, out, NumpyAdapter())
        cfg = pick_config(variant, op, args, tune)
        variant.run(op, cfg, args, PROFILE)
        err = rel_err(out, a.astype(np.float64) @ b.astype(np.float64))
        fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE), "numpy": lambda: np.matmul(a, b, out=out_np)}
        if torch is not None:
            ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n, n)
            fns["torch"] = lambda: torch.mm(ta, tb, out=tc)
        _report("gemm", str(n), op, compare(fns), peak, cfg, err, dict(size=n, isa=isa), rows)


LINEAR_M = [1, 8, 32, 128]
LINEAR_M_FP32 = [1, 4, 8, 32]


def bench_linear(isa, tune, torch, peak, rows, n=4096, k=4096):
    """fp32 nn.Linear decode shapes: M tokens x (n x k weights, stored N x K) against F.linear, then the same
    weights stored K x N (A @ W) against torch.mm; memory-bound at small M, so the weight traffic
    (4 N K bytes per call) is shown as GB/s next to GFLOP/s (the "F.linear" columns hold the anchor)."""
    if torch is None:
        print("\nnn.Linear fp32: skipped, needs torch (F.linear anchor)")
        return
    print(f"\nnn.Linear fp32 (C = A @ W^T, W {n} x {k} stored N x K), {isa}; GFLOP/s and weight GB/s (best of "
          f"interleaved runs), ratio = F.linear time / ours")
    print(f"{'size':>28} {'tracea':>8} {'anchor':>8} {'ratio':>7} {'% peak':>7}  config (GEMV/axpy drivers: tile "
          f"unused)")
    variant = CpuGemmVariant(ISA_BY_NAME[isa])
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n, k), dtype=np.float32)
    tw = torch.from_numpy(w)
    # then A @ W with W stored K x N (the axpy driver) against torch.mm, reported in the same columns
    w_kn = np.ascontiguousarray(w.T)
    tw_kn = torch.from_numpy(w_kn)
    for m, linear in [(m, True) for m in LINEAR_M_FP32] + [(1, False), (4, False)]:
        op = GemmOp(m, n, k, trans_b=linear)
        a = rng.standard_normal((m, k), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        args = OpArgs({"a": a, "b": w if linear else w_kn, "bias": None}, out, NumpyAdapter())
        cfg = pick_config(variant, op, args, tune)
        variant.run(op, cfg, args, PROFILE)
        err = rel_err(out, a.astype(np.float64) @ w.astype(np.float64).T)
        ta = torch.from_numpy(a)
        anchor = (lambda: torch.nn.functional.linear(ta, tw)) if linear else (lambda: torch.mm(ta, tw_kn))
        fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE), "F.linear": anchor}
        label = f"linear {m}x{n}x{k}" if linear else f"A@W(KxN) {m}x{n}x{k} vs mm"
        row = _report("gemm-linear", label, op, compare(fns), peak, cfg, err,
                      dict(m=m, n=n, k=k, linear=linear, isa=isa), rows)
        gb = 4.0 * n * k / 1e9
        row["weight_gbs"] = gb / (op.flops / row["tracea"] / 1e9)
        row["weight_gbs_F.linear"] = gb / (op.flops / row["F.linear"] / 1e9)
        print(f"{'':>28} weight traffic {row['weight_gbs']:6.1f} GB/s ours, {row['weight_gbs_F.linear']:6.1f} GB/s "
              f"{'F.linear' if linear else 'torch.mm'}")


def bench_gemm_bf16(sizes, tune, torch, threads, rows):
    """bf16 A, B -> bf16 C (fp32 accumulation) against torch.matmul on bf16 CPU tensors (oneDNN)."""
    from tracea_cpu.bf16 import CpuGemmBf16Variant
    from tracea_torch.adapter import TorchAdapter

    if not (PROFILE.has(*AVX512_BF16.requires) and AVX512_BF16.runs_here()):
        print("\nGEMM bf16: skipped, this CPU lacks avx512_bf16")
        return
    if torch is None:
        print("\nGEMM bf16: skipped, needs torch (bf16 tensors; NumPy has no bf16 without ml_dtypes)")
        return
    peak1 = measure_bf16_peak(1)
    peak = peak1 * threads
    print(f"\nGEMM bf16 (C = A @ B, bf16 in/out, fp32 accumulate), avx512_bf16; measured vdpbf16ps peak "
          f"{peak1:.1f} GFLOP/s per core -> {peak:.1f} for {threads} threads")
    print(f"{'size':>28} {'tracea':>8} {'torch':>8} {'ratio':>7} {'% peak':>7}  config")
    variant = CpuGemmBf16Variant()
    gen = torch.Generator().manual_seed(0)
    # squares (A @ B), then nn.Linear shapes: M tokens x (4096 x 4096 weights, stored N x K) against F.linear
    problems = [(n, n, n, False) for n in sizes] + [(m, 4096, 4096, True) for m in LINEAR_M]
    for m, n, k, linear in problems:
        op = GemmOp(m, n, k, trans_b=linear, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
        a = torch.randn(m, k, generator=gen).bfloat16()
        b = torch.randn(*((n, k) if linear else (k, n)), generator=gen).bfloat16()
        out = torch.empty(m, n, dtype=torch.bfloat16)
        out_t = torch.empty(m, n, dtype=torch.bfloat16)
        args = OpArgs({"a": a, "b": b, "bias": None}, out, TorchAdapter())
        cfg = pick_config(variant, op, args, tune)
        variant.run(op, cfg, args, PROFILE)
        bt = b.double().t() if linear else b.double()
        err = rel_err(out.double().numpy(), (a.double() @ bt).numpy()) if m * n * k <= 1 << 30 else float("nan")
        if linear:
            fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE),
                   "torch": lambda: torch.nn.functional.linear(a, b)}
        else:
            fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE),
                   "torch": lambda: torch.matmul(a, b, out=out_t)}
        label = f"linear {m}x{n}x{k}" if linear else str(m)
        _report("gemm-bf16", label, op, compare(fns), peak, cfg, err,
                dict(size=m if not linear else None, m=m, n=n, k=k, linear=linear, isa="avx512bf16"), rows)


RESNET_3X3 = [(64, 56), (128, 28), (256, 14), (512, 7)]
RESNET_1X1 = [(64, 256, 56), (256, 64, 56)]


def bench_conv(isa, batches, tune, torch, peak, rows, quick, only_3x3=False):
    print(f"\nconv2d fp32, ResNet-50 layers, {isa}; GFLOP/s; torch = oneDNN in the same memory layout")
    print(f"{'layer':>28} {'tracea':>8} {'torch':>8} {'ratio':>7} {'% peak':>7}  config")
    variant = CpuConv2dVariant(ISA_BY_NAME[isa])
    rng = np.random.default_rng(1)
    layers = [(c, c, hw, 3, 1) for c, hw in RESNET_3X3]
    if not quick and not only_3x3:
        layers += [(c, k, hw, 1, 0) for c, k, hw in RESNET_1X1]
    for batch in batches:
        for c, k, hw, r, pad in layers:
            for layout in ("nchw", "nhwc"):
                op = Conv2dOp(batch, c, hw, hw, k, r, r, padding=pad, layout=layout)
                x = rng.standard_normal(op.x_shape, dtype=np.float32)
                w = rng.standard_normal(op.w_shape, dtype=np.float32) * 0.05
                out = np.empty(op.out_shape, np.float32)
                args = OpArgs({"x": x, "w": w, "bias": None}, out, NumpyAdapter())
                cfg = pick_config(variant, op, args, tune)
                variant.run(op, cfg, args, PROFILE)
                err = rel_err(out, conv2d_ref(x, w, op)) if batch == 1 else float("nan")
                fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE)}
                if torch is not None:
                    tx = torch.from_numpy(x if layout == "nchw" else x.transpose(0, 3, 1, 2))
                    tw = torch.from_numpy(w if layout == "nchw" else w.transpose(0, 3, 1, 2))
                    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
                    tx, tw = tx.contiguous(memory_format=fmt), tw.contiguous(memory_format=fmt)

                    def run_torch(tx=tx, tw=tw, pad=pad):
                        with torch.no_grad():
                            torch.nn.functional.conv2d(tx, tw, padding=pad)
                    fns["torch"] = run_torch
                label = f"n{batch} {c}->{k}@{hw}^2 {r}x{r} {layout}"
                _report("conv2d", label, op, compare(fns), peak, cfg, err,
                        dict(layer=f"n{batch} {c}->{k}@{hw}^2 {r}x{r}", layout=layout, isa=isa), rows)


ATTN = [(1, 8, 512, 64), (1, 8, 1024, 64), (1, 8, 2048, 64), (1, 8, 1024, 128), (4, 8, 512, 64)]


def bench_attention(isa, tune, torch, peak, rows, quick):
    print(f"\nattention fp32 forward, {isa}; GFLOP/s (causal counts unmasked pairs only); torch = SDPA")
    print(f"{'problem':>28} {'tracea':>8} {'torch':>8} {'ratio':>7} {'% peak':>7}  config")
    variant = CpuAttentionVariant(ISA_BY_NAME[isa])
    rng = np.random.default_rng(2)
    for b, h, s, d in (ATTN[:3] if quick else ATTN):
        for causal in (False, True):
            op = AttentionOp(b, h, s, s, d, causal=causal)
            q, k, v = (rng.standard_normal((b, h, s, d), dtype=np.float32) for _ in range(3))
            out = np.empty_like(q)
            args = OpArgs({"q": q, "k": k, "v": v}, out, NumpyAdapter())
            cfg = pick_config(variant, op, args, tune)
            variant.run(op, cfg, args, PROFILE)
            err = rel_err(out, attention_ref(q, k, v, op)) if s <= 1024 else float("nan")
            fns = {"tracea": lambda: variant.run(op, cfg, args, PROFILE)}
            if torch is not None:
                tq, tk, tv = (torch.from_numpy(t) for t in (q, k, v))

                def run_torch(tq=tq, tk=tk, tv=tv, causal=causal):
                    with torch.no_grad():
                        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                fns["torch"] = run_torch
            label = f"b{b} h{h} s{s} d{d}{' causal' if causal else ''}"
            _report("attention", label, op, compare(fns), peak, cfg, err,
                    dict(problem=f"b{b} h{h} s{s} d{d}", causal=causal, isa=isa), rows)


def _err(err: float) -> str:
    # Large problems skip the float64 reference (minutes on 2 cores); the tests cover correctness.
    return f"err={err:.1e}" if math.isfinite(err) else "err=unchecked"


def _cfg(cfg) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes (smoke run)")
    ap.add_argument("--json", default="bench_cpu.json", help="where to write the rows")
    ap.add_argument("--only", default="gemm,gemm-bf16,conv,attention",
                    help="sections (gemm includes the fp32 nn.Linear rows; linear runs them alone)")
    ap.add_argument("--tune", type=int, default=0, help="configs of the search space to try per problem")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: $TRACEA_NUM_THREADS or all cores)")
    ap.add_argument("--isa", default=None, help="ISA to benchmark (default: the best this machine runs)")
    ap.add_argument("--conv-3x3-only", action="store_true", help="conv2d: only the ResNet-50 3x3 layers")
    ns = ap.parse_args(argv)
    threads = thread_count(ns.threads, PROFILE.compute_units)
    os.environ["TRACEA_NUM_THREADS"] = str(threads)
    isa = ns.isa or best_isa()
    torch = torch_mod(threads)
    peak1 = measure_peak(isa, 1)
    peak_multi = measure_peak(isa, threads)
    # On a shared machine the all-thread loop rarely gets every core at once; the reference for
    # "% peak" is the single-core peak times the thread count (the multi-thread figure is shown too).
    peak = peak1 * threads
    print(f"machine: {PROFILE.name} ({platform.machine()}), {PROFILE.compute_units} cores, ISA {isa}, "
          f"threads {threads}; numpy {np.__version__}; torch {getattr(torch, '__version__', 'absent')}")
    print(f"measured fp32 FMA peak ({isa}): {peak1:.1f} GFLOP/s per core -> {peak:.1f} GFLOP/s for {threads} "
          f"threads (all-thread loop measured {peak_multi:.1f}); load average {os.getloadavg()[0]:.2f}")
    rows: list[dict] = []
    only = set(ns.only.split(","))
    if "gemm" in only:
        bench_gemm(isa, [256, 512, 1024] if ns.quick else [256, 512, 1024, 1536, 2048], ns.tune, torch, peak, rows)
    if "gemm" in only or "linear" in only:
        bench_linear(isa, ns.tune, torch, peak, rows)
    if "gemm-bf16" in only:
        bench_gemm_bf16([256, 512, 1024] if ns.quick else [256, 512, 1024, 1536, 2048], ns.tune, torch, threads,
                        rows)
    if "conv" in only:
        bench_conv(isa, [1] if ns.quick else [1, 8], ns.tune, torch, peak, rows, ns.quick, ns.conv_3x3_only)
    if "attention" in only:
        bench_attention(isa, ns.tune, torch, peak, rows, ns.quick)
    with open(ns.json, "w") as fh:
        json.dump(dict(machine=PROFILE.to_dict(), isa=isa, threads=threads, peak_gflops=peak,
                       peak_gflops_per_core=peak1, peak_gflops_all_threads_measured=peak_multi,
                       load_average=os.getloadavg(), rows=rows), fh, indent=1, default=str)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}; wrote {ns.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
