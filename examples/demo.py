#!/usr/bin/env python3
"""Tracea demo: what the Doctor sees, then real kernels tuned and run on the best backend present,
each checked against the float64 reference and timed against NumPy / PyTorch.

    python3 dev.py demo            # from a fresh clone (creates .venv)
    python examples/demo.py --quick  # smaller shapes, fewer tuning trials
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

import tracea
from tracea.cli.doctor_cmd import render_text
from tracea.doctor.report import build_report
from tracea.reference import reference


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out64 = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out64 - ref) / max(np.linalg.norm(ref), 1e-30))


def median_time(fn: Callable[[], Any], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def show(name: str, op: tracea.GemmOp | tracea.Conv2dOp | tracea.AttentionOp, err: float, t: float,
         t_base: float | None, base: str, decision: Any) -> None:
    gflops = op.flops / t / 1e9
    speed = f"{t_base / t:5.2f}x {base}" if t_base else ""
    ok = "OK " if err < 1e-4 else "BAD"
    print(f"  {ok} {name:<34} {decision.variant.name:<24} rel.err {err:8.1e}  {t * 1e3:8.2f} ms "
          f"{gflops:8.1f} GFLOP/s  {speed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and few tuning trials")
    parser.add_argument("--trials", type=int, default=None, help="tuning trials per op")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    doctor = tracea.get_doctor()

    print(render_text(build_report(doctor)))
    device = doctor.best_device()
    print(f"\nRunning on {device} ({doctor.profile_for(device).name})\n")

    s = 256 if args.quick else 1024
    a = rng.standard_normal((s, s), dtype=np.float32)
    b = rng.standard_normal((s, s), dtype=np.float32)
    bias = rng.standard_normal(s, dtype=np.float32)
    gop = tracea.GemmOp(s, s, s, epilogue="bias+gelu")
    x = rng.standard_normal((1, 64, 56, 56) if not args.quick else (1, 32, 28, 28), dtype=np.float32)
    w = rng.standard_normal((64, 64, 3, 3) if not args.quick else (32, 32, 3, 3), dtype=np.float32)
    cb = rng.standard_normal(w.shape[0], dtype=np.float32)
    cop = tracea.Conv2dOp(*x.shape, w.shape[0], 3, 3, padding=1, epilogue="bias+relu")
    q = rng.standard_normal((1, 4, 256 if args.quick else 1024, 64), dtype=np.float32)
    aop = tracea.AttentionOp(1, 4, q.shape[2], q.shape[2], 64, causal=True)

    trials = args.trials or (6 if args.quick else 20)
    try:
        tuner = tracea.AutoTuner(trials=trials)
    except Exception as exc:  # noqa: BLE001 - the demo still runs kernels untuned
        tuner = None
        print(f"(tuning unavailable: {exc})")
    if tuner is not None:
        print(f"Tuning {trials} trials per op (results persist in the tuning cache)...")
        for op in (gop, cop):
            res = tuner.tune(op, device)
            print(f"  tuned {op.describe()}: {res.variant} {res.config.key} median {res.best_s * 1e3:.3f} ms")
        doctor.invalidate()

    print("\nResults (checked against the float64 reference):")
    out = tracea.ops.matmul(a, b, bias=bias, activation="gelu")
    t = median_time(lambda: tracea.ops.matmul(a, b, bias=bias, activation="gelu"))
    tb = median_time(lambda: a @ b)
    show(f"gemm {s}^3 +bias+gelu", gop, rel_err(out, reference(gop, a=a, b=b, bias=bias)), t, tb, "NumPy a@b",
         doctor.decide(gop, device))

    out = tracea.ops.conv2d(x, w, cb, padding=1, activation="relu")
    t = median_time(lambda: tracea.ops.conv2d(x, w, cb, padding=1, activation="relu"))
    tb = _torch_time(lambda tt: tt.nn.functional.relu(tt.nn.functional.conv2d(*_t(tt, x, w, cb), padding=1)))
    show("conv2d 3x3 +bias+relu", cop, rel_err(out, reference(cop, x=x, w=w, bias=cb)), t, tb, "torch CPU",
         doctor.decide(cop, device))

    out = tracea.ops.attention(q, q, q, causal=True)
    t = median_time(lambda: tracea.ops.attention(q, q, q, causal=True))
    tb = _torch_time(lambda tt: tt.nn.functional.scaled_dot_product_attention(*_t(tt, q, q, q), is_causal=True))
    show("attention causal", aop, rel_err(out, reference(aop, q=q, k=q, v=q)), t, tb, "torch SDPA",
         doctor.decide(aop, device))
    print("\nExplain any op: tracea doctor --op 'gemm:m=1024,n=1024,k=1024,epilogue=bias+gelu'")
    return 0


def _t(torch: Any, *arrays: np.ndarray) -> list[Any]:
    return [torch.from_numpy(x) for x in arrays]


def _torch_time(fn: Callable[[Any], Any]) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    with torch.no_grad():
        return median_time(lambda: fn(torch))


if __name__ == "__main__":
    raise SystemExit(main())
