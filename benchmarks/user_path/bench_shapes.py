"""``tracea.ops`` on shapes the project did not tune for, against PyTorch (cuBLAS / cuDNN) in the same run:
the user path (default settings, untuned, calls back to back between CUDA events, nothing queued ahead).

    python benchmarks/user_path/bench_shapes.py                   # every group
    python benchmarks/user_path/bench_shapes.py --groups decode,prefill --json out.json
    TRACEA_TUNING=first-use python benchmarks/user_path/bench_shapes.py   # the first-use tuning policy

Groups: ``decode`` (``x @ W.T``, M = 1 / 4 / 16 / 128 tokens, projections of 7B / 13B / 70B-class models;
also reports the weight bandwidth against a measured device-to-device copy, eager (``bw%``: host time
included, which bounds small weights on a slow host) and with the calls captured in a CUDA graph
(``graph bw%``, ``graph ratio``: the kernels alone)), ``prefill`` (M = 512 / 2048
on the same projections), ``fp32`` (float32 few-row products as PyTorch computes them by default, exact:
``x @ W.T`` at 1-64 rows and ``x @ B`` with B (K, N) row-major at 1-16 rows, with graph ratios and bandwidth),
``odd`` (odd sizes), ``bmm`` (batched), ``conv`` (conv layers of several CNN
families at batch 1 and 32, channels_last fp16 and NCHW fp32), ``grouped`` (depthwise
and grouped layers of EfficientNet, MobileNetV2, ConvNeXt, ResNeXt and RegNet, same batches and dtypes,
with the variant that served each row). Ratios are PyTorch time / Tracea time.
Each row also gives Tracea's first call on the new signature (what the user waits for: compilation where
the kernel cache has none, and with ``TRACEA_TUNING=first-use`` the tuning); each group ends with a
summary line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import tracea

PROJ = {"7B": [(4096, 4096), (11008, 4096), (4096, 11008)], "13B": [(5120, 5120), (13824, 5120)],
        "70B": [(8192, 8192), (28672, 8192), (1024, 8192)]}


def b2b(fn: Callable[[], Any], calls: int) -> float:
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / calls


def first_call(fn: Callable[[], Any]) -> float:
    """Seconds of one synchronized call: on a new signature, what the user waits for on the first call
    (compilation, and with the first-use policy the tuning)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def paired(fa: Callable[[], Any], fb: Callable[[], Any], rounds: int = 7) -> tuple[float, float, float]:
    """Median seconds per call of ``fa`` and ``fb`` (back to back, alternating rounds), and the seconds of
    ``fa``'s first call."""
    first = first_call(fa)
    fb()
    one = max(b2b(fa, 1), b2b(fb, 1))
    calls = max(3, min(200, int(2e-3 / max(one, 1e-7))))
    ta, tb = [], []
    for r in range(rounds):
        for f, acc in ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta)):
            acc.append(b2b(f, calls))
    return statistics.median(ta), statistics.median(tb), first


def copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = statistics.median(b2b(lambda: dst.copy_(src), 20) for _ in range(5))
    return 2 * src.numel() / t  # bytes read + written per second


def graph_time(fn: Callable[[], Any], calls: int = 20, reps: int = 5) -> float:
    """Device seconds per call: ``calls`` calls captured in one CUDA graph, replayed (median of ``reps``);
    no host time in it, so a short kernel's bandwidth shows even where eager calls are host-bound."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / calls)
    return statistics.median(times)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def served() -> str:
    """What the call just timed ran: the variant of the plan ``tracea.ops`` stored last, or "pytorch (why)"."""
    from tracea.runtime import plans

    run = getattr(plans.latest(), "runner", None)
    if run is None:
        return "?"
    if not run.variant:
        return f"pytorch ({(run.reason or '')[:60]})"
    return run.variant + judged(run.decision)


def judged(decision: Any) -> str:
    """With first-use tuning, the framework check's figures for a signature Tracea kept (its timing said
    Tracea's kernel was faster: compare with the row's own ratio)."""
    from tracea_torch import arbiter

    op = decision.op.describe() if decision is not None else None
    v = next((v for v in arbiter.verdicts() if v.op == op), None)
    if v is None or v.winner != "tracea":
        return ""
    return (f" (judged eager {v.torch_eager_s * 1e6:.1f} vs {v.tracea_eager_s * 1e6:.1f} us, device "
            f"{v.torch_s * 1e6:.1f} vs {v.tracea_s * 1e6:.1f})")


def report(rows: list, group: str, what: str, times: tuple[float, float, float], err: float, **extra: Any) -> None:
    t, a, first = times
    if "variant" not in extra:
        extra = {"variant": served(), **extra}
    print(f"  {what:<52} tracea {t * 1e6:9.1f} us  torch {a * 1e6:9.1f} us  ratio {a / t:5.2f}x  err {err:.1e}"
          + "".join(f"  {k} {v}" for k, v in extra.items()) + f"  first call {first * 1e3:.0f} ms", flush=True)
    rows.append({"group": group, "what": what, "tracea_s": t, "torch_s": a, "ratio": a / t, "rel_err": err,
                 "first_call_s": first, **extra})


def gemm_group(rows: list, group: str, ms: list[int], dtype: torch.dtype, bw: float) -> None:
    for model, shapes in PROJ.items():
        for n, k in shapes:
            w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                times = paired(lambda: tracea.ops.matmul(x, w.t()), lambda: x @ w.t())
                extra = {}
                if group == "decode":  # the weight's bytes per second against the copy's, eager and in a graph
                    dev_t, dev_a = graph_time(lambda: tracea.ops.matmul(x, w.t())), graph_time(lambda: x @ w.t())
                    extra["bw%"] = f"{100 * n * k * x.element_size() / times[0] / bw:.0f}"
                    extra["graph bw%"] = f"{100 * n * k * x.element_size() / dev_t / bw:.0f}"
                    extra["graph ratio"] = f"{dev_a / dev_t:.2f}x"
                report(rows, group, f"{model} x{m} @ W{n}x{k}.T {str(dtype)[6:]}", times,
                       rel(tracea.ops.matmul(x, w.t()), x @ w.t()), **extra)


def fp32_rows_group(rows: list, bw: float) -> None:
    """float32 few-row products as PyTorch runs them by default (exact fp32: ``allow_tf32`` off): ``x @ W.T`` of an
    ``nn.Linear`` weight at 1-64 rows and ``x @ B`` of a (K, N) row-major matrix at 1-16 rows, with the graph
    ratio (kernels alone) and the share of the copy bandwidth reading the weight once."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for n, k in ((4096, 4096), (11008, 4096), (1024, 8192), (768, 768)):
        w = torch.randn(n, k, device="cuda") / k ** 0.5
        b = w.t().contiguous()  # (K, N) row-major
        for m in (1, 8, 16, 32, 64):
            x = torch.randn(m, k, device="cuda")
            for what, ours, theirs in ((f"x{m} @ W{n}x{k}.T", lambda: tracea.ops.matmul(x, w.t()), lambda: x @ w.t()),
                                       (f"x{m} @ B{k}x{n}", lambda: tracea.ops.matmul(x, b), lambda: x @ b)):
                if "@ B" in what and m > 16:
                    continue
                times = paired(ours, theirs)
                dev_t, dev_a = graph_time(ours), graph_time(theirs)
                report(rows, "fp32", f"{what} fp32", times, rel(ours(), theirs()),
                       **{"graph ratio": f"{dev_a / dev_t:.2f}x", "graph bw%": f"{100 * n * k * 4 / dev_t / bw:.0f}"})


def odd_group(rows: list) -> None:
    for (m, n, k) in [(3000, 5000, 777), (1000, 1000, 1000), (4097, 4095, 1023), (257, 12345, 4096),
                      (96, 96, 96)]:
        for dtype in (torch.bfloat16, torch.float16):
            a_, b_ = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
            times = paired(lambda: tracea.ops.matmul(a_, b_), lambda: a_ @ b_)
            report(rows, "odd", f"{m}x{n}x{k} {str(dtype)[6:]}", times, rel(tracea.ops.matmul(a_, b_), a_ @ b_))
    for tf32 in (True, False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a_, b_ = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
        times = paired(lambda: tracea.ops.matmul(a_, b_), lambda: a_ @ b_)
        report(rows, "odd", f"4096^3 fp32 {'TF32 allowed' if tf32 else 'exact'}", times,
               rel(tracea.ops.matmul(a_, b_), a_ @ b_))
    torch.backends.cuda.matmul.allow_tf32 = False


def bmm_group(rows: list) -> None:
    for (b, m, n, k) in [(64, 512, 512, 512), (32, 128, 128, 64), (8, 2048, 2048, 128)]:
        x = torch.randn(b, m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(b, k, n, device="cuda", dtype=torch.bfloat16)
        times = paired(lambda: tracea.ops.matmul(x, y), lambda: torch.bmm(x, y))
        report(rows, "bmm", f"bmm {b}x{m}x{n}x{k} bf16", times, rel(tracea.ops.matmul(x, y), torch.bmm(x, y)))


CONVS = {  # family: (C, K, H, R, stride)
    "resnet": [(64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1), (512, 512, 7, 3, 1),
               (256, 64, 56, 1, 1), (64, 256, 56, 1, 1), (3, 64, 224, 7, 2)],
    "vgg": [(64, 128, 112, 3, 1), (256, 256, 56, 3, 1)],
    "mobilenet/efficientnet pointwise": [(32, 16, 112, 1, 1), (96, 24, 56, 1, 1), (240, 40, 28, 1, 1)],
    "unet": [(128, 64, 128, 3, 1), (512, 256, 32, 3, 1)],
    "odd widths (densenet / mobilenet / efficientnet)": [(160, 160, 14, 3, 1), (96, 96, 28, 3, 1), (40, 40, 28, 3, 1),
                                                         (672, 112, 14, 1, 1), (224, 128, 28, 1, 1)],
}


def conv_group(rows: list, families: list[str] | None = None) -> None:
    for family, layers in CONVS.items():
        if families and not any(f in family for f in families):
            continue
        for (c, k, h, r, s) in layers:
            for batch in (1, 32):
                for dtype, cl in ((torch.float16, True), (torch.float32, False)):
                    fmt = torch.channels_last if cl else torch.contiguous_format
                    x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                    w = (torch.randn(k, c, r, r, device="cuda", dtype=dtype) / (c * r * r) ** 0.5).contiguous(
                        memory_format=fmt)
                    bias = torch.randn(k, device="cuda", dtype=dtype)
                    pad = r // 2
                    ours = lambda: tracea.ops.conv2d(x, w, bias, stride=s, padding=pad)  # noqa: E731
                    theirs = lambda: F.conv2d(x, w, bias, stride=s, padding=pad)  # noqa: E731
                    times = paired(ours, theirs)
                    report(rows, "conv", f"{family} {c}->{k} {r}x{r}/{s} @{h}^2 b{batch} {str(dtype)[6:]}"
                           f"{' CL' if cl else ''}", times, rel(ours(), theirs()))


GROUPED_CONVS = {  # family: (C, H, R, stride, groups); K = C (depthwise: groups = C)
    "efficientnet dw": [(96, 112, 3, 2, 96), (144, 56, 3, 1, 144), (240, 28, 5, 1, 240), (480, 14, 3, 1, 480),
                        (672, 14, 5, 2, 672), (1152, 7, 5, 1, 1152)],
    "mobilenetv2 dw": [(32, 112, 3, 1, 32), (192, 28, 3, 1, 192), (960, 7, 3, 1, 960)],
    "convnext dw": [(96, 56, 7, 1, 96), (384, 14, 7, 1, 384), (768, 7, 7, 1, 768)],
    "resnext 32x4d grouped": [(128, 56, 3, 1, 32), (256, 28, 3, 1, 32), (512, 14, 3, 1, 32)],
    "regnetx grouped": [(56, 28, 3, 1, 7), (152, 14, 3, 1, 19)],
    "regnetx-016 grouped": [(168, 28, 3, 1, 7), (408, 14, 3, 1, 17), (912, 7, 3, 1, 38)],  # 24 per group
    # RegNetX-4.0GF (40 per group), RegNetX-3.2GF (48), RegNetY-8.0GF (56), RegNetY-4.0GF (64)
    "regnet wide groups": [(240, 28, 3, 1, 6), (432, 14, 3, 1, 9), (448, 28, 3, 1, 8), (896, 14, 3, 1, 16),
                           (512, 14, 3, 1, 8), (1088, 7, 3, 1, 17)],
}


def grouped_conv_group(rows: list, families: list[str] | None = None) -> None:
    """Depthwise / grouped conv layers (``cuda.conv2d.depthwise``; before it every one fell back to PyTorch),
    bias fused, b1 and b32, channels_last fp16 and NCHW fp32; each row names the variant the Doctor chose and
    adds the ratio with the calls captured in CUDA graphs (device time only) and Tracea's bytes moved (x, w,
    out once) per second of device time. ``families``: substrings of the family names to run (default all)."""
    from tracea.ir.ops import Conv2dOp

    for family, layers in GROUPED_CONVS.items():
        if families and not any(f in family for f in families):
            continue
        for (c, h, r, s, g) in layers:
            for batch in (1, 32):
                for dtype, cl in ((torch.float16, True), (torch.float32, False)):
                    fmt = torch.channels_last if cl else torch.contiguous_format
                    x = torch.randn(batch, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                    w = (torch.randn(c, c // g, r, r, device="cuda", dtype=dtype) / (c // g * r * r) ** 0.5).contiguous(
                        memory_format=fmt)
                    bias = torch.randn(c, device="cuda", dtype=dtype)
                    pad = r // 2
                    op = Conv2dOp(batch, c, h, h, c, r, r, stride=s, padding=pad, groups=g,
                                  layout="nhwc" if cl else "nchw", dtype=str(dtype)[6:], epilogue="bias",
                                  fp32_precision="high" if torch.backends.cudnn.allow_tf32 else "highest")
                    ours = lambda: tracea.ops.conv2d(x, w, bias, stride=s, padding=pad, groups=g)  # noqa: E731
                    theirs = lambda: F.conv2d(x, w, bias, stride=s, padding=pad, groups=g)  # noqa: E731
                    times = paired(ours, theirs)
                    variant = served()  # before the graph captures store plans of their own
                    dev_t, dev_a = graph_time(ours), graph_time(theirs)  # the kernels alone (no host time)
                    report(rows, "grouped", f"{family} {c} g{g} {r}x{r}/{s} @{h}^2 b{batch} {str(dtype)[6:]}"
                           f"{' CL' if cl else ''}", times, rel(ours(), theirs()), variant=variant,
                           **{"graph ratio": f"{dev_a / dev_t:.2f}x",
                              "GB/s": f"{op.min_bytes / dev_t / 1e9:.0f}"})


def summary(label: str, rows: list) -> None:
    """One line: the ratios' median, min and misses, and the first calls' latency."""
    if not rows:
        return
    ratios, firsts = [r["ratio"] for r in rows], [r["first_call_s"] for r in rows]
    print(f"{label} {len(ratios)} cases: median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x, "
          f"below 0.9x: {sum(r < 0.9 for r in ratios)}, below 1.0x: {sum(r < 1.0 for r in ratios)}; first call "
          f"median {statistics.median(firsts) * 1e3:.0f} ms, max {max(firsts) * 1e3:.0f} ms, "
          f"total {sum(firsts):.1f} s")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default="decode,prefill,fp32,odd,bmm,conv,grouped")
    p.add_argument("--json", default="")
    p.add_argument("--families", default="", help="conv and grouped groups: comma-separated substrings of the family names")
    args = p.parse_args(argv)
    groups = set(args.groups.split(","))
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {bw / 1e12:.2f} TB/s (read + write); "
          f"tuning policy {tracea.tuning_mode()}")
    rows: list = []
    if "decode" in groups:
        print("\n[decode] x @ W.T, few tokens")
        gemm_group(rows, "decode", [1, 4, 16, 32, 64, 128], torch.bfloat16, bw)
    if "prefill" in groups:
        print("\n[prefill] x @ W.T, many tokens")
        gemm_group(rows, "prefill", [512, 2048], torch.bfloat16, bw)
    if "fp32" in groups:
        print("\n[fp32] x @ W.T and x @ B, few rows, fp32 exact")
        fp32_rows_group(rows, bw)
    if "odd" in groups:
        print("\n[odd] odd sizes, fp32 modes")
        odd_group(rows)
    if "bmm" in groups:
        print("\n[bmm] batched")
        bmm_group(rows)
    if "conv" in groups:
        print("\n[conv] CNN layers")
        conv_group(rows, [f for f in args.families.split(",") if f])
    if "grouped" in groups:
        print("\n[grouped] depthwise / grouped CNN layers")
        grouped_conv_group(rows, [f for f in args.families.split(",") if f])
    for group in dict.fromkeys(r["group"] for r in rows):
        summary(f"[{group}]", [r for r in rows if r["group"] == group])
    summary("all", rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_Bps": bw, "policy": tracea.tuning_mode(),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
