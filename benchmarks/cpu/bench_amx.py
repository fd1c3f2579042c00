"""bf16 on AMX against torch CPU (oneDNN), interleaved in one run, medians.

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/bench_amx.py [--only gemm,linear,int8,conv,f16,interference]
        [--sizes 512,1024,2048,4096] [--threads T] [--cold MB] [--json out.json]

``--cold MB`` rewrites a buffer of that size before every timed call (not timed): the weights of the
decode rows then come from memory, as in a model with many layers. Without it calls run back to back
and a 32 MB weight may stay cached, which flatters whichever side read it last.

No tuning cache is read (a fresh empty one, as a new user has; ``--keep-cache``: the process default):
the patched layers' arbiter verdicts are persisted there and keyed on the variant and config, not on
the kernel's code, so a verdict measured before a kernel change would otherwise still decide the
``patched`` column (seen: a 128-token verdict "PyTorch" from an older kernel, 4037 vs 3930 us, where
a fresh judgement measured 2310 vs 2881 us and picked Tracea).

Rows (ratios are torch time / Tracea time: > 1 means Tracea is faster):
* ``gemm``: bf16 C = A @ B, n^3. ``user`` is ``tracea.ops.matmul(a, b)`` with default settings (the
  Doctor's pick, untuned); ``amx`` / ``avx512bf16`` are the two variants run directly with their first
  hero config (isolated kernels). Anchor: ``torch.matmul``.
* ``linear``: bf16 ``nn.Linear(4096, 4096)`` (with bias) at 1 / 8 / 32 / 128 tokens: the patched
  module (``tracea_torch.patch_linear``, default settings; it shares the anchor's weight and bias
  tensors) and the two variants run directly, against ``F.linear``.
* ``int8``: ``tracea_cpu.int8.linear_int8`` (the public call: per-row int8 activations, per-channel int8
  weights; AMX ``tdpbssd``, AVX512-VNNI ``vpdpbusd`` at 1-4 tokens or on CPUs without AMX) against ``torch.ao.nn.quantized.dynamic.Linear`` (qint8 per-channel
  weights, same values) at 1 / 8 / 32 / 128 tokens x 4096^2 and a 1024^3 GEMM shape.
* ``conv``: bf16 3x3 conv2d (stride 1, padding 1) of the ResNet stages 64@56^2, 128@28^2, 256@14^2,
  512@7^2 at batch 1 and 8, NCHW (default torch tensors) and NHWC (channels_last): ``user`` is
  ``tracea.ops.conv2d(x, w)`` with default settings (the Doctor's pick, untuned; a torch weight's VNNI
  panels are kept between calls while its version counter is unchanged), ``amx`` the AMX variant run
  directly with its first hero (isolated kernel, panels kept as in ``user``), ``repack`` the same with
  the weight panels packed again on every call (``TRACEA_CPU_WEIGHT_CACHE=0`` around the call). Anchor: ``F.conv2d`` (oneDNN).
* ``f16``: fp16 C = A @ B, n^3 (fp16 in/out, fp32 accumulate): ``user`` is ``tracea.ops.matmul(a, b)``
  on torch float16 tensors (default settings), ``amx`` (``cpu.gemm.f16amx``: exact bf16 split on AMX)
  and ``avx512`` (``cpu.gemm.f16.avx512``: fp32 FMAs) the variants run directly with their first hero. Anchor: ``torch.matmul`` in float16.
* ``interference``: one bf16 GEMM and its torch anchor timed alone (back to back) and interleaved with
  a NumPy (OpenBLAS) fp32 matmul and a torch fp32 matmul between calls, 5 runs after an untimed warm-up
  block of each; prints both ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as bench_cpu.py: before NumPy loads OpenBLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tracea  # noqa: E402
from tracea.doctor.host_plugin import host_profile  # noqa: E402
from tracea.doctor.variant import OpArgs  # noqa: E402
from tracea.ir.ops import GemmOp  # noqa: E402
from tracea_cpu.amx import CpuGemmAmxVariant, amx_permission  # noqa: E402
from tracea_cpu.bf16 import CpuGemmBf16Variant  # noqa: E402
from tracea_torch.adapter import TorchAdapter  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interference import check  # noqa: E402

PROFILE = host_profile()


#: ``--cold MB``: a buffer rewritten before every timed call (untimed), so every call reads its operands
#: from memory, as the layers of a model whose weights exceed the caches do; None: warm (back to back)
_COLD: list = [None]


def compare(fns: dict, min_rounds: int = 7, budget: float = 2.0) -> dict:
    """Interleaved medians (A B C A B C ...) of several callables, seconds, after one warm-up call each
    (with ``--cold``, caches flushed before every timed call)."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    start, rounds = time.perf_counter(), 0
    cold = _COLD[0]
    while rounds < min_rounds or (time.perf_counter() - start < budget and rounds < 50):
        for name, fn in fns.items():
            if cold is not None:
                cold.add_(1.0)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        rounds += 1
    return {name: statistics.median(ts) for name, ts in times.items()}


def _line(label: str, flops: float, t: dict, anchor: str) -> dict:
    cells = "  ".join(f"{n} {flops / s / 1e9:7.0f} GF/s {t[anchor] / s:5.2f}x" if n != anchor
                      else f"{n} {flops / s / 1e9:7.0f} GF/s" for n, s in t.items())
    print(f"{label:>22}  {cells}")
    return dict(label=label, gflops={n: flops / s / 1e9 for n, s in t.items()},
                ratio={n: t[anchor] / s for n, s in t.items()})


#: isolated-kernel columns of the gemm and linear rows (``--kernels``)
KERNELS = ["amxbf16", "avx512bf16"]


def _variants(op: GemmOp, args: OpArgs) -> dict:
    fns = {}
    for v in (CpuGemmAmxVariant(), CpuGemmBf16Variant()):
        if v.isa.name not in KERNELS or v.check(op, PROFILE):
            continue
        cfg = v.hero_configs(op, PROFILE)[0]
        fns[v.isa.name] = (lambda v=v, cfg=cfg: v.run(op, cfg, args, PROFILE))
    return fns


def bench_gemm(sizes: list[int], rows: list) -> None:
    print("\nbf16 GEMM n^3 (bf16 in/out, fp32 accumulate), medians, ratio = torch.matmul time / ours")
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=gen).bfloat16()
        b = torch.randn(n, n, generator=gen).bfloat16()
        out = torch.empty(n, n, dtype=torch.bfloat16)
        op = GemmOp(n, n, n, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
        fns = {"user": lambda: tracea.ops.matmul(a, b)}
        fns.update(_variants(op, OpArgs({"a": a, "b": b, "bias": None}, out, TorchAdapter())))
        fns["torch"] = lambda: torch.matmul(a, b)
        rows.append(dict(kind="gemm", n=n, **_line(str(n), 2.0 * n ** 3, compare(fns), "torch")))


def bench_linear(tokens: list[int], rows: list, n: int = 4096, k: int = 4096) -> None:
    import tracea_torch

    print(f"\nbf16 nn.Linear({k}, {n}) with bias, medians, ratio = F.linear time / ours")
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(k, n).bfloat16()
    patched = torch.nn.Sequential(torch.nn.Linear(k, n).bfloat16())
    # the same parameters (not a copy): every column reads one weight, so none finds it cached because
    # another column just read it while the others' copy went cold
    patched[0].weight, patched[0].bias = lin.weight, lin.bias
    tracea_torch.patch_linear(patched)
    w, bias = lin.weight.detach(), lin.bias.detach()
    for m in tokens:
        x = torch.randn(m, k, generator=gen).bfloat16()
        out = torch.empty(m, n, dtype=torch.bfloat16)
        op = GemmOp(m, n, k, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16", epilogue="bias")
        fns = {"patched": lambda: patched(x)}
        fns.update(_variants(op, OpArgs({"a": x, "b": w, "bias": bias}, out, TorchAdapter())))
        fns["torch"] = lambda: torch.nn.functional.linear(x, w, bias)
        with torch.no_grad():
            rows.append(dict(kind="linear", m=m, **_line(f"{m} tokens", 2.0 * m * n * k, compare(fns), "torch")))


def _uncached(fn, *args) -> None:
    """``fn(*args)`` with the AMX weight-panel cache off (``TRACEA_CPU_WEIGHT_CACHE=0``): packed per call."""
    old = os.environ.get("TRACEA_CPU_WEIGHT_CACHE")
    os.environ["TRACEA_CPU_WEIGHT_CACHE"] = "0"
    try:
        fn(*args)
    finally:
        if old is None:
            del os.environ["TRACEA_CPU_WEIGHT_CACHE"]
        else:
            os.environ["TRACEA_CPU_WEIGHT_CACHE"] = old


def bench_conv(batches: list[int], rows: list) -> None:
    from tracea.ir.ops import Conv2dOp
    from tracea_cpu.amx_conv import CpuConv2dAmxVariant

    print("\nbf16 conv2d 3x3 s1 p1 (bf16 in/out, fp32 accumulate), medians, ratio = F.conv2d time / ours")
    gen = torch.Generator().manual_seed(0)
    variant = CpuConv2dAmxVariant()
    for n in batches:
        for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
            for layout in ("NCHW", "NHWC"):
                x = torch.randn(n, c, hw, hw, generator=gen).bfloat16()
                w = torch.randn(c, c, 3, 3, generator=gen).bfloat16()
                if layout == "NHWC":
                    x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
                fns = {"user": lambda x=x, w=w: tracea.ops.conv2d(x, w, padding=1)}
                op = Conv2dOp(n, c, hw, hw, c, 3, 3, padding=(1, 1), layout=layout, dtype="bf16", dtype_out="bf16")
                if not variant.check(op, PROFILE):
                    cfg = variant.hero_configs(op, PROFILE)[0]
                    xk, wk = (x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)) if layout == "NHWC" else (x, w)
                    args = OpArgs({"x": xk, "w": wk, "bias": None}, torch.empty(op.out_shape, dtype=torch.bfloat16),
                                  TorchAdapter())
                    fns["amx"] = lambda args=args, cfg=cfg, op=op: variant.run(op, cfg, args, PROFILE)
                    fns["repack"] = lambda args=args, cfg=cfg, op=op: _uncached(variant.run, op, cfg, args, PROFILE)
                fns["torch"] = lambda x=x, w=w: torch.nn.functional.conv2d(x, w, None, 1, 1)
                flops = 2.0 * n * hw * hw * c * c * 9
                rows.append(dict(kind="conv", n=n, c=c, hw=hw, layout=layout,
                                 **_line(f"b{n} {c}@{hw}^2 {layout}", flops, compare(fns, budget=1.5), "torch")))


def bench_f16(sizes: list[int], rows: list) -> None:
    from tracea_cpu.f16 import CpuGemmF16Variant
    from tracea_cpu.f16_amx import CpuGemmF16AmxVariant
    from tracea_cpu.isa import AVX512

    print("\nfp16 GEMM n^3 (fp16 in/out, fp32 accumulate), medians, ratio = torch.matmul time / ours")
    gen = torch.Generator().manual_seed(0)
    variants = {"amx": CpuGemmF16AmxVariant(), "avx512": CpuGemmF16Variant(AVX512)}
    for n in sizes:
        a = torch.randn(n, n, generator=gen).half()
        b = torch.randn(n, n, generator=gen).half()
        op = GemmOp(n, n, n, dtype_a="f16", dtype_b="f16", dtype_out="f16")
        fns = {"user": lambda: tracea.ops.matmul(a, b)}
        args = OpArgs({"a": a, "b": b, "bias": None}, torch.empty(n, n, dtype=torch.float16), TorchAdapter())
        for name, v in variants.items():
            if not v.check(op, PROFILE):
                fns[name] = lambda v=v, cfg=v.hero_configs(op, PROFILE)[0], op=op: v.run(op, cfg, args, PROFILE)
        fns["torch"] = lambda: torch.matmul(a, b)
        rows.append(dict(kind="f16", n=n, **_line(str(n), 2.0 * n ** 3, compare(fns), "torch")))


def bench_int8(tokens: list[int], rows: list, n: int = 4096, k: int = 4096) -> None:
    import warnings

    from tracea_cpu.int8 import fallback_reason, kernel_in_use, linear_int8, quantize_weight

    print(f"\nint8 linear {k} -> {n} with bias (fp32 in/out), medians, ratio = torch dynamic quantized Linear "
          f"time / ours; ours: {kernel_in_use()}{' (' + fallback_reason() + ')' if fallback_reason() else ''}")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    qw = quantize_weight(w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qlin = torch.ao.nn.quantized.dynamic.Linear(k, n, dtype=torch.qint8)
        wq = torch.quantize_per_channel(w, torch.from_numpy(qw.scale).double(), torch.zeros(n, dtype=torch.long),
                                        0, torch.qint8)
        qlin.set_weight_bias(wq, bias)
    for m in tokens:
        x = torch.randn(m, k, generator=gen)
        fns = {"linear_int8": lambda: linear_int8(x, qw, bias), "torch": lambda: qlin(x)}
        rows.append(dict(kind="int8", m=m, **_line(f"{m} tokens", 2.0 * m * n * k, compare(fns), "torch")))


def bench_interference(n: int, rows: list, runs: int = 5) -> None:
    print(f"\ninterference: bf16 GEMM {n}^3 user path vs torch.matmul, alone and with NumPy + torch fp32 "
          f"matmuls (512^2) between calls; ratio = torch time / ours")
    a = torch.randn(n, n).bfloat16()
    b = torch.randn(n, n).bfloat16()
    an, bn = np.random.rand(512, 512).astype(np.float32), np.random.rand(512, 512).astype(np.float32)
    at, bt = torch.from_numpy(an.copy()), torch.from_numpy(bn.copy())
    res = check(lambda: tracea.ops.matmul(a, b), lambda: torch.matmul(a, b), [lambda: an @ bn, lambda: at @ bt],
                "torch", runs=runs)
    rows.append(dict(kind="interference", n=n, **res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="gemm,linear,int8,conv,f16,interference")
    ap.add_argument("--batches", default="1,8", help="conv batch sizes")
    ap.add_argument("--sizes", default="512,1024,2048,3072,4096")
    ap.add_argument("--tokens", default="1,8,32,128")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for Tracea ($TRACEA_NUM_THREADS) and torch (default: every core); one "
                         "thread gives comparable figures on a machine other processes keep busy")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help="isolated-kernel columns of the gemm / linear rows (amxbf16, avx512bf16; empty: none). "
                         "The AVX512_BF16 kernel runs 5-20x longer than the others at 512-1024, so its calls "
                         "dominate the rounds they share")
    ap.add_argument("--cold", type=int, default=0,
                    help="MB of a buffer rewritten before every timed call (e.g. 3x the last-level cache; 0: warm, "
                         "calls back to back): decode rows then read their weights from memory, as in a model")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep-cache", action="store_true",
                    help="use the process's tuning cache (arbiter verdicts, tuned configs) instead of a fresh one")
    ns = ap.parse_args(argv)
    if not ns.keep_cache:
        import tempfile

        from tracea.tuning.cache import TuningCache, set_cache

        set_cache(TuningCache(os.path.join(tempfile.mkdtemp(prefix="tracea-bench-amx-"), "tuning.json")))
    if ns.cold:
        _COLD[0] = torch.ones(ns.cold * (1 << 20) // 4)
    KERNELS[:] = [k for k in ns.kernels.split(",") if k]
    if ns.threads:
        os.environ["TRACEA_NUM_THREADS"] = str(ns.threads)
        torch.set_num_threads(ns.threads)
    why = amx_permission() if PROFILE.has("amx_tile", "amx_bf16") else "this CPU lacks AMX-BF16"
    print(f"machine: {PROFILE.name}, {PROFILE.compute_units} cores, {PROFILE.extras.get('isa_summary')}; "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads); AMX: {why or 'usable'}; "
          f"load average {os.getloadavg()[0]:.1f}; caches {'flushed (' + str(ns.cold) + ' MB) before every call' if ns.cold else 'warm'}")
    rows: list = []
    only = ns.only.split(",")
    if "gemm" in only:
        bench_gemm([int(s) for s in ns.sizes.split(",")], rows)
    if "linear" in only:
        bench_linear([int(s) for s in ns.tokens.split(",")], rows)
    if "int8" in only:
        bench_int8([int(s) for s in ns.tokens.split(",")] + [1024], rows)
    if "f16" in only:
        bench_f16([int(s) for s in ns.sizes.split(",") if int(s) <= 2048], rows)
    if "conv" in only:
        bench_conv([int(s) for s in ns.batches.split(",")], rows)
    if "interference" in only:
        bench_interference(1024, rows)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(dict(machine=PROFILE.name, python=sys.version, platform=platform.platform(), rows=rows), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
