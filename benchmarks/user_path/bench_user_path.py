"""The user path, measured as a user meets it: the public call or the patched module, default settings,
untuned, no queuing ahead, timed against the framework's own call in the same run.

    python benchmarks/user_path/bench_user_path.py                       # CPU: host time per call
    python benchmarks/user_path/bench_user_path.py --device cuda         # + GPU calls and patched models
    python benchmarks/user_path/bench_user_path.py --device cuda --models resnet,decoder --timm resnet50

Sections (each prints Tracea, the anchor and their ratio; ``--json PATH`` writes every figure):

* ``host``: host time per call until the call returns (kernel queued or run): ``tracea.ops.matmul`` on
  16x16 NumPy arrays vs NumPy; patched ``nn.Linear`` / ``nn.Conv2d`` vs the same module unpatched.
* ``calls`` (CUDA): a patched ``nn.Conv2d`` / ``nn.Linear`` vs the module unpatched: host time per call,
  and back-to-back throughput (N calls between two CUDA events, nothing queued ahead), interleaved by rounds.
* ``models``: whole forwards, patched vs eager (same weights): a ResNet-style CNN (fp16 channels_last and
  fp32, batch 32 and 1) and a transformer decoder block (bf16, prefill and one-token decode); on CUDA
  also both captured in CUDA graphs (replay vs replay). ``--timm NAMES`` adds timm models (random weights).

Ratios are anchor time / Tracea time: above 1.0 Tracea is faster. Machines differ: run both sides here.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import tracea
import tracea_torch
from tracea_torch import fallbacks
from tracea_torch.models import BasicBlock


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------

def host_us(fn: Callable[[], Any], calls: int, rounds: int = 7, sync: Callable[[], None] | None = None) -> float:
    """Median over rounds of the host time per call (perf_counter around ``calls`` calls)."""
    for _ in range(20):
        fn()
    out = []
    for _ in range(rounds):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    if sync:
        sync()
    return statistics.median(out)


def paired(fa: Callable[[], Any], fb: Callable[[], Any], calls: int, rounds: int, device: torch.device,
           host: bool = False) -> tuple[float, float]:
    """Median seconds per call of ``fa`` and ``fb``, interleaved by rounds. CUDA: ``calls`` back-to-back
    calls between two events after a synchronize (nothing queued ahead); CPU (or ``host``): perf_counter."""
    for f in (fa, fb, fa, fb):
        for _ in range(3):
            f()
    if device.type == "cuda" and not host:  # ~20 ms more of each side (H100: b1 graphs timed
        # right after the eager phase read 0.93-0.97x from run to run, 1.05x in a probe that warmed longer)
        torch.cuda.synchronize()
        for f in (fa, fb):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.02:
                for _ in range(calls):
                    f()
                torch.cuda.synchronize()
    ta, tb = [], []
    cuda = device.type == "cuda" and not host
    for r in range(rounds):
        for f, acc in ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(calls):
                    f()
                e.record()
                e.synchronize()
                acc.append(s.elapsed_time(e) / 1e3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    f()
                acc.append((time.perf_counter() - t0) / calls)
    return statistics.median(ta), statistics.median(tb)


def row(results: list, section: str, what: str, tracea_s: float, anchor_s: float, anchor: str, **extra: Any) -> None:
    ratio = anchor_s / tracea_s
    unit, scale = ("us", 1e6) if max(tracea_s, anchor_s) < 2e-3 else ("ms", 1e3)
    print(f"  {what:<58} tracea {tracea_s * scale:9.2f} {unit}  {anchor:<22} {anchor_s * scale:9.2f} {unit}  "
          f"ratio {ratio:5.2f}x", flush=True)
    results.append({"section": section, "what": what, "tracea_s": tracea_s, "anchor": anchor, "anchor_s": anchor_s,
                    "ratio": ratio, **extra})


# ------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------

def host_section(results: list) -> None:
    print("\n[host] host time per call on the CPU (median of rounds)")
    a = np.random.rand(16, 16).astype(np.float32)
    b = np.random.rand(16, 16).astype(np.float32)
    t = host_us(lambda: tracea.ops.matmul(a, b), 2000) / 1e6
    n = host_us(lambda: a @ b, 2000) / 1e6
    row(results, "host", "tracea.ops.matmul 16x16 NumPy", t, n, "NumPy a @ b")
    with torch.no_grad():
        for name, mod, x in (("nn.Linear(16, 16), x 4x16", nn.Linear(16, 16), torch.randn(4, 16)),
                             ("nn.Linear(64, 64), x 8x64", nn.Linear(64, 64), torch.randn(8, 64)),
                             ("nn.Conv2d(4, 8, 3, padding=1), x 1x4x8x8", nn.Conv2d(4, 8, 3, padding=1),
                              torch.randn(1, 4, 8, 8))):
            plain = host_us(lambda: mod(x), 2000) / 1e6
            patched = copy.deepcopy(mod)
            tracea_torch.patch_conv2d(patched)
            tracea_torch.patch_linear(patched)
            tp = host_us(lambda: patched(x), 2000) / 1e6
            row(results, "host", f"patched {name}", tp, plain, "unpatched module")


def calls_section(results: list, device: torch.device) -> None:
    print(f"\n[calls] patched layer vs unpatched, {torch.cuda.get_device_name(device)}")
    cases = []
    for dtype, fmt in ((torch.float16, torch.channels_last), (torch.float32, torch.contiguous_format)):
        conv = nn.Conv2d(64, 64, 3, padding=1).to(device=device, dtype=dtype, memory_format=fmt)
        x = torch.randn(1, 64, 16, 16, device=device, dtype=dtype).contiguous(memory_format=fmt)
        cases.append((f"Conv2d 64->64 3x3 16x16 b1 {str(dtype)[6:]}", conv, x))
        conv = nn.Conv2d(64, 64, 3, padding=1).to(device=device, dtype=dtype, memory_format=fmt)
        x = torch.randn(32, 64, 56, 56, device=device, dtype=dtype).contiguous(memory_format=fmt)
        cases.append((f"Conv2d 64->64 3x3 56x56 b32 {str(dtype)[6:]}", conv, x))
    for dtype in (torch.bfloat16, torch.float32):
        cases.append((f"Linear 512->512 x16 {str(dtype)[6:]}", nn.Linear(512, 512).to(device, dtype),
                      torch.randn(16, 512, device=device, dtype=dtype)))
        cases.append((f"Linear 4096->4096 x1 (decode) {str(dtype)[6:]}", nn.Linear(4096, 4096).to(device, dtype),
                      torch.randn(1, 4096, device=device, dtype=dtype)))
        cases.append((f"Linear 4096->4096 x2048 {str(dtype)[6:]}", nn.Linear(4096, 4096).to(device, dtype),
                      torch.randn(2048, 4096, device=device, dtype=dtype)))
    sync = torch.cuda.synchronize
    with torch.no_grad():
        for name, mod, x in cases:
            patched = copy.deepcopy(mod)
            tracea_torch.patch_conv2d(patched)
            tracea_torch.patch_linear(patched)
            fallbacks.reset()
            rel = float((patched(x).double() - mod(x).double()).norm() / mod(x).double().norm())
            fb = sum(fallbacks.counts().values())
            th = host_us(lambda: patched(x), 200, sync=sync) / 1e6
            ah = host_us(lambda: mod(x), 200, sync=sync) / 1e6
            row(results, "calls", f"host/call  {name}", th, ah, "unpatched module", rel_err=rel, fallbacks=fb)
            tt, ta = paired(lambda: patched(x), lambda: mod(x), 50, 9, device)
            row(results, "calls", f"b2b/call   {name}", tt, ta, "unpatched module", rel_err=rel, fallbacks=fb)


class DecoderBlock(nn.Module):
    """A Llama-style decoder block: RMSNorm, attention (q/k/v/o projections, SDPA, causal), RMSNorm,
    SwiGLU MLP (gate/up/down projections)."""

    def __init__(self, d: int = 2048, heads: int = 16, ffn: int = 5632) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.n1(x)
        q, k, v = (p(h).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def resnet_style(width: int = 64, classes: int = 1000) -> nn.Module:
    w = width
    return nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         BasicBlock(w, w, 1), BasicBlock(w, w, 1), BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w, 1),
                         BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w, 1), BasicBlock(4 * w, 8 * w, 2),
                         BasicBlock(8 * w, 8 * w, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, classes))


def model_cases(device: torch.device, args: argparse.Namespace) -> list[tuple[str, nn.Module, torch.Tensor]]:
    cases = []
    names = set(args.models.split(","))
    cuda = device.type == "cuda"
    if "resnet" in names:
        combos = ([(torch.float16, True), (torch.float32, False)] if cuda else [(torch.float32, False)])
        batches = (32, 1) if cuda else (8, 1)
        size = 224 if cuda else 112
        for dtype, cl in combos:
            for bt in batches:
                fmt = torch.channels_last if cl else torch.contiguous_format
                m = resnet_style().to(device=device, dtype=dtype, memory_format=fmt).eval()
                x = torch.randn(bt, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=fmt)
                cases.append((f"resnet18-style {size}^2 b{bt} {str(dtype)[6:]}{' channels_last' if cl else ''}", m, x))
    if "decoder" in names:
        dtype = torch.bfloat16 if cuda else torch.float32
        d, heads, ffn = (2048, 16, 5632) if cuda else (512, 8, 1408)
        blk = DecoderBlock(d, heads, ffn).to(device=device, dtype=dtype).eval()
        prefill = 2048 if cuda else 128
        cases.append((f"decoder block d{d} prefill 1x{prefill} {str(dtype)[6:]}", blk,
                      torch.randn(1, prefill, d, device=device, dtype=dtype)))
        cases.append((f"decoder block d{d} decode 1x1 {str(dtype)[6:]}", blk, torch.randn(1, 1, d, device=device,
                                                                                           dtype=dtype)))
    for name in filter(None, args.timm.split(",")):
        try:
            import timm  # noqa: PLC0415

            m = timm.create_model(name, pretrained=False).to(device=device).eval()
        except Exception as exc:  # noqa: BLE001
            print(f"  (timm {name} unavailable: {exc})")
            continue
        fp32_batch = getattr(args, "timm_fp32_batch", 32)
        for dtype, cl, bt in ((torch.float16, True, 32), (torch.float32, False, fp32_batch), (torch.float16, True, 1)):
            fmt = torch.channels_last if cl else torch.contiguous_format
            mm = copy.deepcopy(m).to(dtype=dtype, memory_format=fmt)
            x = torch.randn(bt, 3, 224, 224, device=device, dtype=dtype).contiguous(memory_format=fmt)
            cases.append((f"timm {name} b{bt} {str(dtype)[6:]}{' channels_last' if cl else ''}", mm, x))
    return cases


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (after warm-up on a side stream, as torch documents); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def _cpu_calls(fn: Callable[[], Any], sample_s: float = 0.02) -> tuple[int, int]:
    """(calls per sample, rounds) for a CPU forward: samples of about ``sample_s`` and 15 rounds (fewer,
    down to 5, for forwards longer than 0.1 s), so a sub-millisecond forward is not timed three calls at
    a time (its ratio moved +-5% between runs)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    return max(1, min(200, int(sample_s / max(one, 1e-6)))), (15 if one < 0.1 else 5)


def models_section(results: list, device: torch.device, args: argparse.Namespace) -> None:
    print(f"\n[models] whole forwards, patched (untuned, defaults) vs eager, {device}")
    cuda = device.type == "cuda"
    for name, model, x in model_cases(device, args):
        patched = copy.deepcopy(model)
        tracea_torch.patch_conv2d(patched)
        tracea_torch.patch_linear(patched)
        with torch.no_grad():
            fallbacks.reset()
            ref, out = model(x), patched(x)
            rel = float((out.double() - ref.double()).norm() / max(ref.double().norm(), 1e-30))
            fb = dict(fallbacks.counts())
            calls, rounds = (10, 7) if cuda else _cpu_calls(lambda: model(x))
            tt, te = paired(lambda: patched(x), lambda: model(x), calls, rounds, device)
            row(results, "models", f"{name}", tt, te, "eager PyTorch", rel_err=rel,
                fallbacks=sum(fb.values()))
            for (kind, reason), n in sorted(fb.items()):
                print(f"      fallback {kind} x{n}: {reason}")
            if args.verdicts:
                from tracea_torch import arbiter

                for line in fallbacks.report().splitlines():
                    if line.startswith("  "):  # the verdict lines (the counters are printed above)
                        print(f"      {line.strip()}")
                arbiter.reset()
            if cuda and not args.no_graphs:
                try:
                    gp, ge = graphed(lambda: patched(x)), graphed(lambda: model(x))
                    tt, te = paired(gp, ge, calls, 7, device)
                    row(results, "models", f"{name} [CUDA graphs]", tt, te, "eager in CUDA graphs", rel_err=rel)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"  {name} [CUDA graphs]: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    results.append({"section": "models", "what": f"{name} [CUDA graphs]", "error": str(exc)[:500]})


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sections", default="host,calls,models")
    p.add_argument("--models", default="resnet,decoder")
    p.add_argument("--timm", default="", help="comma-separated timm model names (random weights)")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--verdicts", action="store_true", help="print the arbiter's verdicts of each model")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    machine = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    try:
        import subprocess  # noqa: PLC0415

        machine["cpu"] = next(line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name"))
    except Exception:  # noqa: BLE001
        pass
    print(f"machine: {machine}")
    results: list = []
    sections = set(args.sections.split(","))
    if "host" in sections:
        host_section(results)
    if "calls" in sections and device.type == "cuda":
        calls_section(results, device)
    if "models" in sections:
        models_section(results, device, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
