"""The CPU user path against its anchors, interleaved in one run: ``tracea.ops.matmul`` (default call,
untuned, fp32) vs NumPy ``a @ b`` at 512-2048, and ``tracea.ops.conv2d`` vs ``torch.nn.functional.conv2d``
on ResNet-50's 3x3 layers at batch 1 and 8 (NCHW NumPy arrays / torch CPU tensors); ``--only bf16``:
``tracea.ops.matmul(x, W.T, bias)`` and a patched ``nn.Linear`` (``tracea_torch.patch_linear``, arbiter on)
vs ``F.linear`` on torch CPU bf16 tensors (``--bf16-shapes``; tokens x out x in), and ``tracea.ops.conv2d`` vs
``F.conv2d`` on the ``--conv-layers`` at batch 1 in bf16, NCHW and channels_last; ``--only interference``:
fp32 1024^3 ``tracea.ops.matmul`` vs NumPy alone and with NumPy + torch matmuls between calls, as users mix
them (OpenBLAS's default thread timeout; issue 17's "within 10%" check).

    source scripts/srcenv.sh
    OMP_WAIT_POLICY=passive python benchmarks/cpu/bench_user_cpu.py [--rounds 30] [--only gemm,conv] [--json out.json]
        [--threads T] [--gemm-shapes 512,1024,512x4096x4096] [--conv-layers 64@56,128@28] [--batches 1,8]

``--gemm-shapes``: squares (``n``) and ``MxNxK`` GEMMs (default: 512-2048 squares and two LLM-like
projections, 512 tokens x 4096^2 and 2048 tokens x 4096 -> 1024). ``--threads T`` runs Tracea, NumPy's
BLAS and torch on T threads (``TRACEA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``,
set before NumPy loads); the default is every core.

Each round calls Tracea then the anchor (order alternating by round), one call each, timed with
``perf_counter``; the figures are medians over the rounds and the ratio is anchor time / Tracea time
(> 1: Tracea faster). No tuning cache is read (a fresh empty one), so this is what a new user gets.
Thread pools: OpenBLAS, torch's OpenMP and Tracea's OpenMP workers spin after a call and can slow the
next library on a small machine; ``OMP_WAIT_POLICY=passive`` (printed) makes OpenMP workers sleep.
"""

from __future__ import annotations

import os
import sys

_USER_ENV = dict(os.environ)

# before NumPy loads OpenBLAS (see bench_cpu.py); not for the interference section, which measures what a
# user gets (OpenBLAS's workers busy-wait ~0.1 s after each call by default)
_ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv[:-1] else ""
if _ONLY != "interference":
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
if "--threads" in sys.argv[:-1]:  # thread counts of the BLAS pools are read when NumPy loads
    _t = sys.argv[sys.argv.index("--threads") + 1]
    for _v in ("TRACEA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = _t

import argparse
import json
import statistics
import subprocess
import tempfile
import time

import numpy as np

import tracea
from tracea.doctor import get_doctor
from tracea.doctor.host_plugin import host_profile
from tracea.tuning.cache import TuningCache, set_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interference import check  # noqa: E402

RESNET_3X3 = [(64, 56), (128, 28), (256, 14), (512, 7)]


def interference_rows(n: int, runs: int = 5, with_torch: bool = True) -> list[dict]:
    """Issue 17's interference check for fp32: ``tracea.ops.matmul`` n^3 against NumPy ``a @ b``, each timed
    alone (back to back) and with a NumPy and a torch 512^2 fp32 matmul before every timed call; ratio =
    NumPy time / Tracea time per run, and how far the interleaved ratio moves from the alone one (target:
    within 10%, median over ``runs``). Runs without ``OPENBLAS_THREAD_TIMEOUT`` unless the caller set it.
    ``with_torch=False`` (``--interference-others numpy``): NumPy's matmul only, torch never imported (a
    NumPy program)."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    an, bn = rng.standard_normal((512, 512), dtype=np.float32), rng.standard_normal((512, 512), dtype=np.float32)
    others = [lambda: an @ bn]
    threads = ""
    if with_torch:
        import torch

        at, bt = torch.from_numpy(an.copy()), torch.from_numpy(bn.copy())
        others.append(lambda: at @ bt)
        threads = f", torch {torch.get_num_threads()} threads"
    from tracea_cpu.pool import status as pool_status

    print(f"interference: fp32 {n}^3 tracea.ops.matmul vs NumPy, alone and with NumPy{' + torch' * with_torch} "
          f"512^2 matmuls before each call (OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT', '(unset)')}{threads}; worker pool: {pool_status()})")
    res = check(lambda: tracea.ops.matmul(a, b), lambda: a @ b, others, "numpy", runs=runs)
    with_what = "numpy+torch" if with_torch else "numpy"
    return [dict(case=f"interference fp32 {n}^3 ({with_what})", **res)]


def interleaved(ours, theirs, rounds: int) -> tuple[float, float]:
    for _ in range(3):
        ours(), theirs()
    a, b = [], []
    for r in range(rounds):
        pair = ((ours, a), (theirs, b)) if r % 2 == 0 else ((theirs, b), (ours, a))
        for fn, ts in pair:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(a), statistics.median(b)


def _blas_name() -> str:
    """The BLAS NumPy links (the anchor), as NumPy's build configuration names it."""
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[call-arg,index]
        return f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:  # older NumPy: no dict mode
        return "BLAS unknown"


def _sections_apart(args: argparse.Namespace) -> int | None:
    """With both sections asked for, each runs in a process of its own and this returns the worst exit
    code; None when one section runs here. Why: Tracea's CPU kernels and torch share one OpenMP runtime
    (libgomp), whose spin setting is read once, and the two anchors want it set differently. The GEMM
    section asks for Tracea's short spin (``TRACEA_OMP_SPIN=short``): with libgomp's default, Tracea's idle
    workers spin ~16 ms after each call and the NumPy call alternating with it ran ~1.6x slower
    (1024^3, 2-core VM). The conv section loads torch before Tracea, so torch owns the runtime with its own
    default, as for a tracea-torch user (torch's convs ran 4-18% slower in a runtime Tracea had loaded
    with the short spin)."""
    only = [s for s in args.only.split(",") if s]
    if len(only) < 2 or os.environ.get("_TRACEA_BENCH_CHILD"):
        return None
    rc, parts = 0, []
    for sec in only:
        argv = [a for a in sys.argv[1:]]
        i = argv.index("--only") if "--only" in argv else -1
        if i >= 0:
            argv[i + 1] = sec
        else:
            argv += ["--only", sec]
        part = f"{args.json}.{sec}" if args.json else ""
        if part:
            argv[argv.index("--json") + 1] = part
            parts.append(part)
        env = {**os.environ, "_TRACEA_BENCH_CHILD": "1"}
        if sec == "gemm":
            env.setdefault("TRACEA_OMP_SPIN", "short")
        if sec == "interference" and "OPENBLAS_THREAD_TIMEOUT" not in _USER_ENV:
            env.pop("OPENBLAS_THREAD_TIMEOUT", None)
        rc = max(rc, subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=env).returncode)
    if args.json:
        merged: dict = {}
        for part in parts:
            with open(part) as f:
                d = json.load(f)
            merged = {**d, "rows": merged.get("rows", []) + d.get("rows", [])}
            os.remove(part)
        with open(args.json, "w") as f:
            json.dump(merged, f, indent=1)
    return rc


def bf16_rows(args: argparse.Namespace) -> list[dict]:
    """bf16 linear layers on torch CPU tensors: ``tracea.ops.matmul`` and a patched ``nn.Linear`` vs
    ``F.linear`` (on CPUs without AVX512_BF16 / AMX PyTorch's bf16 path is slow; Tracea widens to fp32)."""
    import torch
    import torch.nn.functional as F

    import tracea_torch

    rows = []
    g = torch.Generator().manual_seed(0)
    for shape in args.bf16_shapes.split(","):
        m, n_, k = (int(v) for v in shape.split("x")) if "x" in shape else (int(shape),) * 3
        x = torch.randn(m, k, generator=g).bfloat16()
        lin = torch.nn.Linear(k, n_).bfloat16().eval()
        w, b = lin.weight.detach(), lin.bias.detach()
        patched = tracea_torch.patch_linear(torch.nn.Sequential(torch.nn.Linear(k, n_).bfloat16().eval()))
        patched[0].load_state_dict(lin.state_dict())
        with torch.no_grad():
            ref = F.linear(x.double(), w.double(), b.double())
            out = tracea.ops.matmul(x, w.t(), bias=b)
            err = float((out.double() - ref).norm() / ref.norm())
            d = get_doctor().decide(tracea.GemmOp(m, n_, k, trans_b=True, dtype_a="bf16", dtype_b="bf16",
                                                  epilogue="bias"), "cpu")
            t, n = interleaved(lambda: tracea.ops.matmul(x, w.t(), bias=b), lambda: F.linear(x, w, b), args.rounds)
            patched(x)  # the arbiter's first call
            tp, n2 = interleaved(lambda: patched(x), lambda: lin(x), args.rounds)
        fl = 2 * m * n_ * k
        rows.append(dict(case=f"linear bf16 {m}x{n_}x{k}", tracea_gflops=fl / t / 1e9, anchor="torch",
                         anchor_gflops=fl / n / 1e9, ratio=n / t, patched_ratio=n2 / tp, rel_err=err,
                         config=d.config.key, variant=d.variant.name))
        print(f"{rows[-1]['case']:<28} tracea {rows[-1]['tracea_gflops']:6.0f} GFLOP/s  torch "
              f"{rows[-1]['anchor_gflops']:6.0f}  ratio {n / t:.2f}x  patched nn.Linear {n2 / tp:.2f}x  err {err:.1e}"
              f"  [{d.variant.name} {d.config.key}]", flush=True)
    for c, hw in (tuple(int(v) for v in lay.split("@")) for lay in args.conv_layers.split(",")):
        for fmt, tag in ((torch.contiguous_format, "NCHW"), (torch.channels_last, "CL")):
            x = torch.randn(1, c, hw, hw, generator=g).bfloat16().contiguous(memory_format=fmt)
            w = (torch.randn(c, c, 3, 3, generator=g) / (9 * c) ** 0.5).bfloat16().contiguous(memory_format=fmt)
            with torch.no_grad():
                ref = F.conv2d(x.double(), w.double(), padding=1)
                err = float((tracea.ops.conv2d(x, w, padding=1).double() - ref).norm() / ref.norm())
                t, n = interleaved(lambda: tracea.ops.conv2d(x, w, padding=1), lambda: F.conv2d(x, w, padding=1),
                                   args.rounds)
            fl = 2 * c * c * 9 * hw * hw
            rows.append(dict(case=f"conv bf16 {c}@{hw} b1 {tag}", tracea_gflops=fl / t / 1e9, anchor="torch",
                             anchor_gflops=fl / n / 1e9, ratio=n / t, rel_err=err))
            print(f"{rows[-1]['case']:<28} tracea {fl / t / 1e9:6.0f} GFLOP/s  torch {fl / n / 1e9:6.0f}  ratio "
                  f"{n / t:.2f}x  err {err:.1e}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--only", default="gemm,conv")
    ap.add_argument("--json", default="")
    ap.add_argument("--interference-others", default="numpy,torch", choices=["numpy,torch", "numpy"],
                    help="the calls made before each timed call in --only interference (numpy: torch not imported)")
    ap.add_argument("--threads", type=int, default=0, help="threads for every library (default: every core)")
    ap.add_argument("--gemm-shapes", default="512,768,1024,1536,2048,512x4096x4096,2048x1024x4096")
    ap.add_argument("--conv-layers", default=",".join(f"{c}@{hw}" for c, hw in RESNET_3X3),
                    help="ResNet 3x3 layers channels@size (default: all four)")
    ap.add_argument("--batches", default="1,8", help="conv batch sizes")
    ap.add_argument("--bf16-shapes", default="512,1024,2048,32x4096x4096,128x4096x4096,512x4096x4096,512x11008x4096",
                    help="bf16 linear shapes: n (n^3) or tokens x out x in")
    args = ap.parse_args()
    apart = _sections_apart(args)
    if apart is not None:
        return apart
    interference_torch = args.interference_others != "numpy"
    torch_first = {"conv", "bf16"} | ({"interference"} if interference_torch else set())
    if torch_first & set(args.only.split(",")):
        import torch  # noqa: F401 - before Tracea's first kernel: torch owns the OpenMP runtime (see above)
    set_cache(TuningCache(os.path.join(tempfile.mkdtemp(), "empty_cache.json")))
    prof = host_profile()
    print(f"machine: {prof.name}, {prof.compute_units} cores, {prof.extras.get('microarch')}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
          f"TRACEA_OMP_SPIN={os.environ.get('TRACEA_OMP_SPIN', '(unset)')}; NumPy {np.__version__} "
          f"({_blas_name()}); threads {args.threads or 'all'}; load average {os.getloadavg()[0]:.1f}")
    rows = []
    rng = np.random.default_rng(0)
    only = set(args.only.split(","))
    if "gemm" in only:
        for shape in args.gemm_shapes.split(","):
            m, n_, k = (int(v) for v in shape.split("x")) if "x" in shape else (int(shape),) * 3
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n_), dtype=np.float32)
            out = tracea.ops.matmul(a, b)
            err = float(np.linalg.norm(out.astype(np.float64) - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b))
            d = get_doctor().decide(tracea.GemmOp(m, n_, k), "cpu")
            t, n = interleaved(lambda: tracea.ops.matmul(a, b), lambda: a @ b, args.rounds)
            fl = 2 * m * n_ * k
            case = f"gemm fp32 {m}^3" if m == n_ == k else f"gemm fp32 {m}x{n_}x{k}"
            rows.append(dict(case=case, tracea_gflops=fl / t / 1e9, anchor="numpy", anchor_gflops=fl / n / 1e9,
                             ratio=n / t, rel_err=err, config=d.config.key, variant=d.variant.name))
            print(f"{rows[-1]['case']:<28} tracea {rows[-1]['tracea_gflops']:6.0f} GFLOP/s  numpy {rows[-1]['anchor_gflops']:6.0f}"
                  f"  ratio {rows[-1]['ratio']:.2f}x  err {err:.1e}  [{d.variant.name} {d.config.key}]", flush=True)
    if "conv" in only:
        import torch
        import torch.nn.functional as F

        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        layers = [tuple(int(v) for v in lay.split("@")) for lay in args.conv_layers.split(",")]
        for batch in (int(v) for v in args.batches.split(",")):
            for c, hw in layers:
                x = rng.standard_normal((batch, c, hw, hw), dtype=np.float32)
                w = (rng.standard_normal((c, c, 3, 3), dtype=np.float32) / np.sqrt(9 * c)).astype(np.float32)
                xt, wt = torch.from_numpy(x), torch.from_numpy(w)
                out = tracea.ops.conv2d(x, w, padding=1)
                ref = F.conv2d(xt.double(), wt.double(), padding=1).numpy()
                err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                op = tracea.Conv2dOp(batch, c, hw, hw, c, 3, 3, padding=1)
                d = get_doctor().decide(op, "cpu")
                with torch.no_grad():
                    t, n = interleaved(lambda: tracea.ops.conv2d(x, w, padding=1), lambda: F.conv2d(xt, wt, padding=1),
                                       args.rounds)
                fl = op.flops
                rows.append(dict(case=f"conv 3x3 {c}@{hw} b{batch}", tracea_gflops=fl / t / 1e9, anchor="torch",
                                 anchor_gflops=fl / n / 1e9, ratio=n / t, rel_err=err, config=d.config.key,
                                 variant=d.variant.name))
                print(f"{rows[-1]['case']:<28} tracea {rows[-1]['tracea_gflops']:6.0f} GFLOP/s  torch {rows[-1]['anchor_gflops']:6.0f}"
                      f"  ratio {rows[-1]['ratio']:.2f}x  err {err:.1e}  [{d.variant.name} {d.config.key}]", flush=True)
    if "bf16" in only:
        rows += bf16_rows(args)
    if "interference" in only:
        rows += interference_rows(1024, with_torch=interference_torch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": prof.to_dict(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
