#!/usr/bin/env python3
"""Tracea demo: what the Doctor sees, then real kernels tuned and run on the best device present, each
checked against the float64 reference and timed against the usual library (NumPy/OpenBLAS and torch on
the CPU, torch's cuBLAS/cuDNN/SDPA on a CUDA GPU).

    python3 dev.py demo                # from a fresh clone (creates .venv)
    python examples/demo.py --quick    # smaller shapes, fewer tuning trials
    python examples/demo.py --device cpu
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
from tracea.errors import NoVariantError
from tracea.reference import reference
from tracea.testing import rel_err, tolerance

ADAPTER_PREFERENCE = ("numpy", "cupy", "pyopencl", "torch")


def pick_adapter(doctor: tracea.Doctor, device: tracea.Device) -> Any:
    """The adapter that allocates arrays on ``device`` (NumPy on the host, CuPy on CUDA ...)."""
    serving = [a for a in doctor.adapters() if device.kind in a.device_kinds]
    serving.sort(key=lambda a: ADAPTER_PREFERENCE.index(a.name) if a.name in ADAPTER_PREFERENCE else 99)
    if not serving:
        raise SystemExit(f"no array adapter allocates on {device}")
    return serving[0]


def median_time(fn: Callable[[], Any], sync: Callable[[], None], repeats: int = 7) -> float:
    # Let other thread pools go idle first: NumPy's OpenBLAS workers (used by the float64 reference
    # check) busy-wait for ~0.1 s after a call and slow whatever runs next on a 2-core machine by ~1.5x.
    time.sleep(0.3)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_baselines(device: tracea.Device) -> tuple[Any, Callable[[], None], str] | None:
    """(torch, sync, label) for the device, or None when torch cannot run there."""
    try:
        import torch
    except ImportError:
        return None
    if device.kind == "cpu":
        return torch, lambda: None, "torch CPU"
    if device.kind == "cuda" and torch.cuda.is_available():
        return torch, torch.cuda.synchronize, "torch CUDA"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and few tuning trials")
    parser.add_argument("--trials", type=int, default=None, help="tuning trials per variant")
    parser.add_argument("--device", default=None, help="device to use (default: the best one present)")
    args = parser.parse_args()
    rng = np.random.default_rng()
    doctor = tracea.get_doctor()

    print(render_text(build_report(doctor)))
    ctx = tracea.Context(args.device)
    device = ctx.device
    adapter = pick_adapter(doctor, device)
    print(f"\nRunning on {device} ({ctx.profile.name}) with {adapter.name} arrays\n")
    dev = lambda arr: adapter.from_numpy(arr, device)  # noqa: E731

    s = 256 if args.quick else 1024
    host = {"a": rng.standard_normal((s, s), dtype=np.float32) / 8, "b": rng.standard_normal((s, s), dtype=np.float32) / 8,
            "bias": rng.standard_normal(s, dtype=np.float32),
            "x": rng.standard_normal((1, 32, 28, 28) if args.quick else (8, 64, 56, 56), dtype=np.float32),
            "q": rng.standard_normal((1, 4, 256 if args.quick else 1024, 64), dtype=np.float32)}
    host["w"] = rng.standard_normal((host["x"].shape[1],) * 2 + (3, 3), dtype=np.float32) / 12
    host["cb"] = rng.standard_normal(host["w"].shape[0], dtype=np.float32)
    d = {k: dev(v) for k, v in host.items()}
    gop = tracea.GemmOp(s, s, s, epilogue="bias+gelu_tanh")
    cop = tracea.Conv2dOp(*host["x"].shape, host["w"].shape[0], 3, 3, padding=1, epilogue="bias+relu")
    aop = tracea.AttentionOp(*host["q"].shape[:3], host["q"].shape[2], 64, causal=True)

    trials = args.trials or (6 if args.quick else 16)
    try:
        tuner = tracea.AutoTuner(trials=trials)
    except Exception as exc:  # noqa: BLE001 - the demo still runs kernels untuned
        tuner = None
        print(f"(tuning unavailable: {exc})")
    if tuner is not None:
        print(f"Tuning up to {trials} trials per variant (results persist in the tuning cache)...")
        for op in (gop, cop):
            try:
                res = tuner.tune(op, device)
            except NoVariantError as exc:
                print(f"  {op.describe()}: nothing to tune ({str(exc).splitlines()[0]})")
                continue
            if res.ok:
                origin = "from the cache" if res.from_cache else f"{res.measured_trials} trials"
                print(f"  {op.describe()}: {res.variant} {res.config.key}  median {res.best_s * 1e3:.3f} ms ({origin})")
        doctor.invalidate()

    tb = torch_baselines(device)
    cases = [
        ("gemm +bias+gelu", gop, lambda: tracea.ops.matmul(d["a"], d["b"], bias=d["bias"], activation="gelu"),
         dict(a=host["a"], b=host["b"], bias=host["bias"]),
         (lambda t, T: T.nn.functional.gelu(t["a"] @ t["b"] + t["bias"], approximate="tanh"))),
        ("conv2d 3x3 +bias+relu", cop, lambda: tracea.ops.conv2d(d["x"], d["w"], d["cb"], padding=1, activation="relu"),
         dict(x=host["x"], w=host["w"], bias=host["cb"]),
         (lambda t, T: T.relu(T.nn.functional.conv2d(t["x"], t["w"], t["cb"], padding=1)))),
        ("attention causal", aop, lambda: tracea.ops.attention(d["q"], d["q"], d["q"], causal=True),
         dict(q=host["q"], k=host["q"], v=host["q"]),
         (lambda t, T: T.nn.functional.scaled_dot_product_attention(t["q"], t["q"], t["q"], is_causal=True))),
    ]
    print("\nResults (each output checked against the float64 reference):")
    failures = 0
    for name, op, run, ref_args, torch_fn in cases:
        try:
            decision = doctor.decide(op, device)
            out = run()
        except NoVariantError as exc:
            print(f"  --  {name:<24} no kernel on {device}: {str(exc).splitlines()[0]}")
            continue
        err = rel_err(adapter.to_host(out), reference(op, **ref_args).reshape(adapter.info(out).shape))
        ok = err <= tolerance(op.dtypes[0], getattr(op, "fp32_precision", tracea.Fp32Precision.HIGHEST))
        failures += not ok
        t = median_time(run, ctx.synchronize)
        base = ""
        if tb is not None:
            torch, sync, label = tb
            tt = {k: torch.from_numpy(v).to("cuda" if device.kind == "cuda" else "cpu") for k, v in host.items()}
            with torch.no_grad():
                t_base = median_time(lambda: torch_fn(tt, torch), sync)
            base = f"  {t_base / t:5.2f}x {label}"
        print(f"  {'OK ' if ok else 'BAD'} {name:<24} {decision.variant.name:<26} rel.err {err:8.1e}  "
              f"{t * 1e3:8.3f} ms {op.flops / t / 1e9:9.1f} GFLOP/s{base}")
    print("\nWhy these kernels: tracea doctor --op 'gemm:m=1024,n=1024,k=1024,epilogue=bias+gelu'")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
