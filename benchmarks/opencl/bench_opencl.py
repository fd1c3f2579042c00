#!/usr/bin/env python3
"""OpenCL backend benchmark: tuned GEMM and conv2d against NumPy / torch on the same machine.

For each shape it runs a short sweep over the variant's search space (hero configs plus a sample), keeps
the fastest config, and reports GFLOP/s next to the anchors measured in the same run:

* CPU OpenCL devices: NumPy (OpenBLAS) SGEMM and torch CPU (oneDNN) matmul / conv2d;
* GPU OpenCL devices: torch CUDA (cuBLAS SGEMM with TF32 off, cuDNN conv) when torch sees a GPU.

Times are medians of wall-clock runs (launch + ``queue.finish()``), so launch overhead is included, as for
the anchors. Wrap in ``flock /tmp/tracea-bench.lock`` on shared machines. Examples::

    flock /tmp/tracea-bench.lock python benchmarks/opencl/bench_opencl.py --json /tmp/opencl.json
    python benchmarks/opencl/bench_opencl.py --gemm 1024,2048 --conv none --sweep 12 --device 0
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

CONV_LAYERS = {  # name: (n, c, h, w, k, r, s, stride, padding), ResNet-50 3x3 layers at batch 1
    "res2_3x3": (1, 64, 56, 56, 64, 3, 3, 1, 1),
    "res3_3x3": (1, 128, 28, 28, 128, 3, 3, 1, 1),
    "res4_3x3": (1, 256, 14, 14, 256, 3, 3, 1, 1),
}


def median_time(fn: Callable[[], Any], sync: Callable[[], Any], min_runs: int = 5, budget_s: float = 1.0) -> float:
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int = 5,
                per_round: int = 3, pause_s: float = 0.1) -> dict[str, float]:
    """Median time of each function, measured in rounds (each round: every contender in turn, one untimed
    run then ``per_round`` timed ones) so load changes on a shared machine hit every contender alike.
    The pause before each contender lets the previous one's worker threads (OpenBLAS, TBB, OpenMP spin
    for a while after a call) go idle, so they do not steal cores from the next contender."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, sync) in fns.items():
            time.sleep(pause_s)
            fn()
            sync()
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                sync()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def sweep(variant: Any, op: Any, profile: Any, args: Any, queue: Any, n_sample: int, seed: int = 0,
          budget_s: float = 0.3) -> tuple[Any, float, int]:
    """Fastest config among heroes + a random sample of the search space; returns (config, seconds, tried)."""
    space = list(variant.search_space(op, profile))
    rng = np.random.default_rng(seed)
    sample = [space[i] for i in rng.choice(len(space), min(n_sample, len(space)), replace=False)]
    candidates = list(dict.fromkeys(variant.hero_configs(op, profile) + sample))
    best, best_t = None, float("inf")
    for cfg in candidates:
        try:
            variant.prepare(op, cfg, profile)
            t = median_time(lambda: variant.launch(op, cfg, args, profile), queue.finish, min_runs=3,
                            budget_s=budget_s)
        except Exception as exc:  # a config the device cannot build or run scores infinity
            print(f"    skip {cfg.key}: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
            continue
        if VERBOSE:
            print(f"    {t * 1e3:9.3f} ms  {cfg.key}", file=sys.stderr, flush=True)
        if t < best_t:
            best, best_t = cfg, t
    return best, best_t, len(candidates)


VERBOSE = False


def torch_module():
    try:
        import torch  # noqa: PLC0415

        return torch
    except ImportError:
        return None


def bench_gemm(size: int, profile: Any, n_sample: int) -> dict[str, Any]:
    from tracea.doctor.variant import OpArgs
    from tracea.ir.ops import GemmOp
    from tracea_opencl import context_queue, to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.gemm import OpenCLGemm

    op = GemmOp(size, size, size)
    rng = np.random.default_rng(size)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    dev = profile.device
    _, queue = context_queue(dev)
    args = OpArgs({"a": to_device(a, dev), "b": to_device(b, dev), "bias": None},
                  to_device(np.zeros((size, size), np.float32), dev), PyOpenCLAdapter())
    variant = OpenCLGemm()
    cfg, _, tried = sweep(variant, op, profile, args, queue, n_sample)
    fns = {"opencl": (lambda: variant.launch(op, cfg, args, profile), queue.finish), **anchors_gemm(a, b, profile)}
    times = interleaved(fns)
    t_cl = times.pop("opencl")
    out = args.out.get().astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    flop = op.flops
    row: dict[str, Any] = {"op": f"gemm {size}^3 f32", "config": cfg.key, "configs_tried": tried,
                           "opencl_gflops": flop / t_cl / 1e9, "rel_err": err}
    for name, t in times.items():
        row[f"{name}_gflops"] = flop / t / 1e9
        row[f"ratio_vs_{name}"] = t / t_cl
    return row


def anchors_gemm(a: np.ndarray, b: np.ndarray, profile: Any) -> dict[str, tuple[Callable, Callable]]:
    out: dict[str, tuple[Callable, Callable]] = {}
    torch = torch_module()
    if profile.extras.get("device_type") == "gpu":
        if torch is not None and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            out["cublas_sgemm"] = (lambda: ta @ tb, torch.cuda.synchronize)
        return out
    out["numpy"] = (lambda: a @ b, lambda: None)
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch_cpu"] = (lambda: ta @ tb, lambda: None)
    return out


def bench_conv(name: str, layout: str, profile: Any, n_sample: int) -> dict[str, Any]:
    from tracea.doctor.variant import OpArgs
    from tracea.ir.ops import Conv2dOp
    from tracea_opencl import context_queue, to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.conv2d import OpenCLConv2d

    n, c, h, w, k, r, s, stride, pad = CONV_LAYERS[name]
    op = Conv2dOp(n, c, h, w, k, r, s, stride=stride, padding=pad, layout=layout, epilogue="bias+relu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal(op.x_shape).astype(np.float32)
    wt = (rng.standard_normal(op.w_shape) / np.sqrt(c * r * s)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    dev = profile.device
    _, queue = context_queue(dev)
    args = OpArgs({"x": to_device(x, dev), "w": to_device(wt, dev), "bias": to_device(bias, dev)},
                  to_device(np.zeros(op.out_shape, np.float32), dev), PyOpenCLAdapter())
    variant = OpenCLConv2d()
    cfg, _, tried = sweep(variant, op, profile, args, queue, n_sample)
    cl_fn = (lambda: variant.launch(op, cfg, args, profile), queue.finish)
    torch = torch_module()
    if torch is None or (profile.extras.get("device_type") == "gpu" and not torch.cuda.is_available()):
        t_cl = interleaved({"opencl": cl_fn})["opencl"]
        return {"op": f"conv2d {name} {layout} +bias+relu", "config": cfg.key, "configs_tried": tried,
                "opencl_gflops": op.flops / t_cl / 1e9}
    import torch.nn.functional as F  # noqa: N812, PLC0415

    on_gpu = profile.extras.get("device_type") == "gpu"
    xt = torch.from_numpy(x if layout == "NCHW" else x.transpose(0, 3, 1, 2).copy())
    wt_t = torch.from_numpy(wt if layout == "NCHW" else wt.transpose(0, 3, 1, 2).copy())
    bt = torch.from_numpy(bias)
    if on_gpu:
        torch.backends.cudnn.allow_tf32 = False
        xt, wt_t, bt = xt.cuda(), wt_t.cuda(), bt.cuda()
    if layout == "NHWC":
        xt = xt.contiguous(memory_format=torch.channels_last)
        wt_t = wt_t.contiguous(memory_format=torch.channels_last)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    with torch.no_grad():
        ref = F.relu(F.conv2d(xt, wt_t, bt, stride=stride, padding=pad))
        times = interleaved({"opencl": cl_fn,
                             "ref": (lambda: F.relu(F.conv2d(xt, wt_t, bt, stride=stride, padding=pad)), sync)})
    t_cl, t_ref = times["opencl"], times["ref"]
    row: dict[str, Any] = {"op": f"conv2d {name} {layout} +bias+relu", "config": cfg.key,
                           "configs_tried": tried, "opencl_gflops": op.flops / t_cl / 1e9}
    ref_np = ref.cpu().numpy().astype(np.float64)
    if layout == "NHWC":
        ref_np = ref_np.transpose(0, 2, 3, 1)
    out = args.out.get().astype(np.float64)
    row["rel_err_vs_torch"] = float(np.linalg.norm(out - ref_np) / np.linalg.norm(ref_np))
    anchor = "cudnn" if on_gpu else "torch_cpu"
    row[f"{anchor}_gflops"] = op.flops / t_ref / 1e9
    row[f"ratio_vs_{anchor}"] = t_ref / t_cl
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="OpenCL device index or name (default: $TRACEA_OPENCL_DEVICE, "
                    "else the first GPU, else device 0)")
    ap.add_argument("--gemm", default="512,1024,2048", help="comma-separated square GEMM sizes, or 'none'")
    ap.add_argument("--conv", default=",".join(CONV_LAYERS), help="conv layers to run, or 'none'")
    ap.add_argument("--layouts", default="NCHW,NHWC")
    ap.add_argument("--sweep", type=int, default=10, help="random search-space configs tried besides the heroes")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--verbose", action="store_true", help="print every swept config's time")
    ns = ap.parse_args(argv)
    global VERBOSE
    VERBOSE = ns.verbose

    import tracea_opencl  # noqa: PLC0415
    from tracea_opencl.devices import profile_of  # noqa: PLC0415

    st = tracea_opencl.status()
    if not st.available:
        print(f"OpenCL unavailable, nothing to benchmark: {st.reason}")
        return 0
    profile = profile_of(tracea_opencl.select_device(ns.device))
    print(f"device {profile.device}: {profile.name} ({profile.extras.get('platform')}, driver "
          f"{profile.driver_version}, {profile.compute_units} compute units)", flush=True)
    rows = []
    sizes = [] if ns.gemm == "none" else [int(s) for s in ns.gemm.split(",")]
    for size in sizes:
        row = bench_gemm(size, profile, ns.sweep)
        rows.append(row)
        print(json.dumps(row), flush=True)
    layers = [] if ns.conv == "none" else ns.conv.split(",")
    for name in layers:
        for layout in ns.layouts.split(","):
            row = bench_conv(name, layout, profile, ns.sweep)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'op':40s} {'OpenCL GF/s':>12s}  anchors (GF/s, ratio OpenCL/anchor)")
    for row in rows:
        anchors = [k[len("ratio_vs_"):] for k in row if k.startswith("ratio_vs_")]
        text = ", ".join(f"{a} {row[f'{a}_gflops']:.1f} ({row[f'ratio_vs_{a}']:.2f}x)" for a in anchors)
        print(f"{row['op']:40s} {row['opencl_gflops']:12.1f}  {text}")
    result = {"device": profile.to_dict(), "python": platform.python_version(), "numpy": np.__version__,
              "pyopencl": st.pyopencl_version, "results": rows}
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
        print(f"wrote {ns.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
