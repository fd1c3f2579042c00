"""Tracea CUDA kernels vs cuBLAS / cuBLASLt / cuDNN, side by side in one run (H200 targets).

Usage (on a GPU machine, from the repo root):
    source scripts/srcenv.sh && python benchmarks/cuda/bench_cuda.py --json out.json [--quick] [--only gemm,conv]

Every Tracea figure uses the best of the variant's hero configs (a short tuning pass, reported; the
configs are timed interleaved with each other, since heroes a percent apart were mis-ranked when timed
one after another), CUDA events after warm-up, median of many runs, inputs rotated when they fit in L2. The chosen
config and each baseline are then timed interleaved (ours, theirs, ours, theirs ...) in the same process
on the same tensors, so clock and power drift cannot favour either side; the printed TFLOP/s and ratios
come from that paired pass. Before each timed loop the GPU is parked on a sleep kernel so the whole
loop is queued ahead of it: the events time device work only (host time per call is its own line).
Prints a table and writes all numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import Conv2dOp, GemmOp
from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants

VARIANTS = {v.name: v for v in all_variants()}
L2 = 60 * 2**20
CONFIG_LOG: dict[str, dict[str, float]] = {}  # op -> "variant config" -> TFLOP/s (every config tried)


def _queue_ahead() -> None:
    """Park the GPU on a ~20 ms sleep kernel so the host enqueues the whole timed loop before the GPU
    reaches it: the events then time back-to-back device work, never a GPU idling while Python issues
    the next launch (which would charge each side its host overhead; that is reported separately)."""
    torch.cuda._sleep(40_000_000)


def paired(fns, sets: int, reps: int = 40, warmup: int = 5) -> list[float]:
    """Median seconds of each ``fn(i)``, timed interleaved (fn0, fn1, fn0, fn1 ...) so that clock and
    power drift hits Tracea and its anchor alike; the ratios come from these."""
    for i in range(warmup):
        for fn in fns:
            fn(i % sets)
    torch.cuda.synchronize()
    _queue_ahead()
    events = [[] for _ in fns]
    for i in range(reps):
        for fn, ev in zip(fns, events):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(i % sets)
            e.record()
            ev.append((s, e))
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in ev) / 1e3 for ev in events]


def timed(fn, sets: int, reps: int = 30, warmup: int = 5) -> float:
    """Median seconds of one call of ``fn(i)`` (i rotates over input sets)."""
    return paired([fn], sets, reps, warmup)[0]


def n_sets(nbytes: int) -> int:
    return 1 if nbytes > 3 * L2 else max(2, min(8, (3 * L2) // max(nbytes, 1)))


def tracea_best(variant, op, inputs, heroes: int) -> tuple[float, str, float]:
    """(seconds, config key, rel err vs float64) of the best of the first ``heroes`` hero configs, timed
    interleaved (like Tracea and its anchor) so that configs a percent apart are ranked on the same GPU
    state rather than on its drift between consecutive sweeps."""
    profile = T.gpu_profile()
    configs = []
    for config in variant.hero_configs(op, profile)[:heroes]:
        if not variant.validate_config(op, config, profile):
            continue
        try:
            variant.prepare(op, config, profile)
        except Exception as exc:  # report and keep going
            print(f"  ! {variant.name} {config.key}: {exc}", file=sys.stderr)
            continue
        configs.append(config)
    if not configs:
        return float("inf"), "", float("nan")
    args = [T.op_args(t) for t in inputs]
    fns = [(lambda c: (lambda i: variant.run(op, c, args[i], profile)))(c) for c in configs]
    secs = paired(fns, len(inputs), reps=30)
    for config, sec in zip(configs, secs):
        CONFIG_LOG.setdefault(op.describe(), {})[f"{variant.name} {config.key}"] = op.flops / sec / 1e12
    sec, key = min((sec, c.key) for sec, c in zip(secs, configs))
    return sec, key, float("nan")


def gemm_variants(op):
    if op.dtype_a.value in ("float16", "bfloat16"):
        names = ["cuda.gemm.wgmma", "cuda.gemm.mma_f16"]
    else:
        names = (["cuda.gemm.wgmma_tf32", "cuda.gemm.mma_tf32"] if op.fp32_precision.value != "highest"
                 else ["cuda.gemm.wgmma_3xtf32", "cuda.gemm.mma_3xtf32"])
    return [VARIANTS[n] for n in names if not VARIANTS[n].check(op, T.gpu_profile())]


def gemm_case(rows, name, op, baselines, heroes, check_err=False):
    nbytes = op.min_bytes
    inputs = [T.gemm_inputs(op, seed=i) for i in range(n_sets(nbytes))]
    for t in inputs:  # drop the batch dim for torch baselines (views, no copies)
        t["a2"], t["b2"], t["o2"] = t["a"][0], t["b"][0], t["out"][0]
    per_variant = {}
    sec, cfg, variant = float("inf"), "", None
    for v in gemm_variants(op):
        vs, vc, _ = tracea_best(v, op, inputs, heroes)
        per_variant[v.name] = op.flops / vs / 1e12 if vs < float("inf") else 0.0
        if vs < sec:
            sec, cfg, variant = vs, vc, v
    err = float("nan")
    best_cfg = [c for c in variant.hero_configs(op, T.gpu_profile()) if c.key == cfg][0]
    if check_err:
        inputs[0]["out"].fill_(float("nan"))
        variant.run(op, best_cfg, T.op_args(inputs[0]), T.gpu_profile())
        err = T.rel_err(inputs[0]["out"], T.gemm_reference(op, inputs[0]))
    row = {"case": name, "op": op.describe(), "sweep_s": sec, "config": cfg, "variant": variant.name,
           "rel_err": err, "per_variant": per_variant}
    args = [T.op_args(t) for t in inputs]
    ours = lambda i: variant.run(op, best_cfg, args[i], T.gpu_profile())  # noqa: E731
    for bname, (fn, prep) in baselines.items():
        if prep:
            prep()
        tsec, bsec = paired([ours, lambda i: fn(inputs[i])], len(inputs))
        row.setdefault("tracea_s", tsec)
        row.setdefault("tracea_tflops", op.flops / tsec / 1e12)
        row[f"{bname}_tflops"] = op.flops / bsec / 1e12
        row[f"ratio_vs_{bname}"] = bsec / tsec
    rows.append(row)
    print(fmt(row), flush=True)


def conv_case(rows, name, op, heroes):
    variant = VARIANTS["cuda.conv2d.implicit_mma"]  # replaced by the fastest variant serving the op
    inputs = [T.conv_inputs(op, seed=i) for i in range(n_sets(op.min_bytes))]
    nhwc = op.layout.value == "nhwc"
    for t in inputs:
        if nhwc:  # cuDNN's fast path: channels_last tensors (logical NCHW views of the same memory)
            t["xt"] = t["x"].permute(0, 3, 1, 2)
            t["wt"] = t["w"].permute(0, 3, 1, 2)
        else:
            t["xt"], t["wt"] = t["x"], t["w"]
    profile = T.gpu_profile()
    sec, cfg, per_variant = float("inf"), "", {}
    for v in (VARIANTS["cuda.conv2d.wgmma"], VARIANTS["cuda.conv2d.implicit_mma"]):
        if v.check(op, profile):
            continue
        vs, vc, _ = tracea_best(v, op, inputs, heroes)
        per_variant[v.name] = op.flops / vs / 1e12 if vs < float("inf") else 0.0
        if vs < sec:
            sec, cfg, variant = vs, vc, v
    torch.backends.cudnn.benchmark = True

    def cudnn(t):
        y = F.conv2d(t["xt"], t["wt"], t["bias"], stride=op.stride, padding=op.padding)
        return torch.relu_(y)

    best_cfg = [c for c in variant.hero_configs(op, profile) if c.key == cfg][0]
    args = [T.op_args(t) for t in inputs]
    sec, bsec = paired([lambda i: variant.run(op, best_cfg, args[i], profile), lambda i: cudnn(inputs[i])],
                       len(inputs))
    row = {"case": name, "op": op.describe(), "tracea_s": sec, "tracea_tflops": op.flops / sec / 1e12, "config": cfg,
           "variant": variant.name, "cudnn_tflops": op.flops / bsec / 1e12, "ratio_vs_cudnn": bsec / sec,
           "per_variant": per_variant}
    rows.append(row)
    print(fmt(row), flush=True)


def fmt(row) -> str:
    ratios = " ".join(f"{k[9:]}={v:.2f}x" for k, v in row.items() if k.startswith("ratio_vs_"))
    base = " ".join(f"{k[:-7]}={v:.0f}" for k, v in row.items() if k.endswith("_tflops") and k != "tracea_tflops")
    err = f" err={row['rel_err']:.1e}" if row.get("rel_err") == row.get("rel_err") and "rel_err" in row else ""
    return (f"{row['case']:<34} tracea={row['tracea_tflops']:7.1f} TF/s  {base}  {ratios}{err}  "
            f"[{row['variant']} {row['config']}]")


def gemm_suite(rows, quick, heroes):
    mm = lambda t: torch.matmul(t["a2"], t["b2"], out=t["o2"])  # noqa: E731
    sizes = [4096, 8192] if quick else [2048, 4096, 8192]
    for dt in ("bfloat16", "float16"):
        for s in sizes:
            gemm_case(rows, f"{dt} {s}^3", GemmOp(s, s, s, dtype_a=dt, dtype_b=dt), {"cublas": (mm, None)}, heroes)
    llm = [(4096, 4096), (11008, 4096), (4096, 11008)] if quick else \
        [(4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (4096, 14336)]
    for n, k in llm:
        gemm_case(rows, f"bf16 llm M8192 N{n} K{k}", GemmOp(8192, n, k, dtype_a="bfloat16", dtype_b="bfloat16"),
                  {"cublas": (mm, None)}, heroes)
    eager = lambda t: F.gelu(torch.matmul(t["a2"], t["b2"]) + t["bias"], approximate="tanh")  # noqa: E731
    lt = lambda t: torch._addmm_activation(t["bias"], t["a2"], t["b2"], use_gelu=True)  # noqa: E731
    for dt, short in (("bfloat16", "bf16"), ("float16", "fp16")):
        for s in ([8192] if quick else [4096, 8192]):
            gemm_case(rows, f"{short} {s}^3 +bias+gelu", GemmOp(s, s, s, dtype_a=dt, dtype_b=dt, epilogue="bias+gelu"),
                      {"eager": (eager, None), "cublaslt": (lt, None)}, heroes)

    def tf32(on):
        def f():
            torch.backends.cuda.matmul.allow_tf32 = on
        return f

    mmt = lambda t: torch.matmul(t["a2"], t["b2"].t(), out=t["o2"])  # noqa: E731  (B stored (N, K))
    for s in ([8192] if quick else [4096, 8192]):
        gemm_case(rows, f"fp32 tf32 {s}^3", GemmOp(s, s, s, fp32_precision="high"),
                  {"cublas_tf32": (mm, tf32(True))}, heroes)
        # nn.Linear's layout: weights (N, K), so B is K-major and TF32 wgmma needs no transpose pass.
        gemm_case(rows, f"fp32 tf32 {s}^3 x@W.T", GemmOp(s, s, s, trans_b=True, fp32_precision="high"),
                  {"cublas_tf32": (mmt, tf32(True))}, heroes)
        gemm_case(rows, f"fp32 accurate {s}^3", GemmOp(s, s, s, fp32_precision="highest"),
                  {"cublas_sgemm": (mm, tf32(False))}, heroes, check_err=True)
    torch.backends.cuda.matmul.allow_tf32 = False


RESNET = [("3x3 64@56", 64, 56, 64, 3, 1, 1), ("3x3 128@28", 128, 28, 128, 3, 1, 1),
          ("3x3 256@14", 256, 14, 256, 3, 1, 1), ("3x3 512@7", 512, 7, 512, 3, 1, 1),
          ("1x1 64->256@56", 64, 56, 256, 1, 1, 0), ("1x1 256->64@56", 256, 56, 64, 1, 1, 0),
          ("7x7/2 stem 3->64@224", 3, 224, 64, 7, 2, 3)]


def conv_suite(rows, quick, heroes):
    torch.backends.cudnn.allow_tf32 = True  # torch's default for cuDNN
    layers = RESNET[:4] if quick else RESNET
    for label, c, hw, k, r, st, pad in layers:
        conv_case(rows, f"conv f32 NCHW {label}", Conv2dOp(32, c, hw, hw, k, r, r, stride=st, padding=pad,
                                                           layout="nchw", dtype="float32", fp32_precision="high",
                                                           epilogue="bias+relu"), heroes)
    for dt, short in (("float16", "f16"), ("bfloat16", "bf16")):
        for label, c, hw, k, r, st, pad in layers:
            if c % 8:
                continue
            op = Conv2dOp(32, c, hw, hw, k, r, r, stride=st, padding=pad, layout="nhwc", dtype=dt, epilogue="bias+relu")
            conv_case(rows, f"conv {short} NHWC {label}", op, heroes)


def overhead_suite(rows):
    """Host time per call (launch path only) on a tiny GEMM: Tracea's run() vs torch.matmul."""
    op = GemmOp(256, 256, 256, dtype_a="bfloat16", dtype_b="bfloat16")
    t = T.gemm_inputs(op)
    profile = T.gpu_profile()
    out = {}
    for name in ("cuda.gemm.wgmma", "cuda.gemm.mma_f16"):
        v = VARIANTS[name]
        if v.check(op, profile):
            continue
        cfg = v.hero_configs(op, profile)[0]
        args = T.op_args(t)
        for _ in range(20):
            v.run(op, cfg, args, profile)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            v.run(op, cfg, args, profile)
        out[name] = (time.perf_counter() - t0) / 500 * 1e6
        torch.cuda.synchronize()
    a2, b2 = t["a"][0], t["b"][0]
    for _ in range(20):
        torch.matmul(a2, b2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        torch.matmul(a2, b2)
    out["torch.matmul"] = (time.perf_counter() - t0) / 500 * 1e6
    torch.cuda.synchronize()
    print("host us per call (256^3 bf16): " + "  ".join(f"{k}={v:.1f}" for k, v in out.items()), flush=True)
    rows.append({"case": "host overhead", "host_us_per_call": out})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="bench_cuda.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="gemm,conv")
    ap.add_argument("--heroes", type=int, default=3, help="hero configs tried per case")
    a = ap.parse_args()
    if not T.gpu_available():
        print("no GPU / CuPy / torch CUDA: nothing to benchmark", file=sys.stderr)
        return 2
    p = T.gpu_profile()
    print(f"device: {p.name} cc={p.compute_capability} SMs={p.compute_units} driver={p.driver_version} "
          f"runtime={p.runtime_version} nvrtc={p.extras.get('nvrtc')} torch={torch.__version__}", flush=True)
    # Bring the GPU to its steady clocks before the first (small) case: ~1.5 s of large GEMMs.
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.time() + 1.5
    while time.time() < t_end:
        torch.matmul(x, x)
        torch.cuda.synchronize()
    del x
    rows: list[dict] = []
    t0 = time.time()
    if "gemm" in a.only:
        gemm_suite(rows, a.quick, a.heroes)
    if "conv" in a.only:
        conv_suite(rows, a.quick, a.heroes)
    if "overhead" in a.only or "gemm" in a.only:
        overhead_suite(rows)
    with open(a.json, "w") as f:
        json.dump({"device": p.to_dict(), "torch": torch.__version__, "rows": rows, "configs": CONFIG_LOG,
                   "seconds": time.time() - t0},
                  f, indent=1, default=str)
    print(f"\n{'case':<34} {'tracea TF/s':>11}  ratios")
    for r in rows:
        if "tracea_tflops" not in r:
            continue
        ratios = "  ".join(f"{k[9:]} {v:.2f}x" for k, v in r.items() if k.startswith("ratio_vs_"))
        print(f"{r['case']:<34} {r['tracea_tflops']:11.1f}  {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
