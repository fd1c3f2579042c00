"""Tracea's CPU attention against PyTorch's CPU SDPA on the shapes real models use, interleaved in one run.

    source scripts/srcenv.sh
    python benchmarks/cpu/bench_attention_cpu.py [--rounds 40] [--only vit,swin,...] [--dtype float32]
        [--json out.json] [--threads T]

Per shape, three pairs, each timed one call of each side in turn (order alternating by round; medians of
``--rounds`` rounds; ratio = PyTorch time / Tracea time, > 1: Tracea faster):

* ``kernel``: the bound CPU launcher of the plan Tracea built for the call (the C kernel behind one ctypes
  call, on the call's tensors, into a preallocated output) vs ``F.scaled_dot_product_attention``;
* ``ops``: the user call ``tracea.ops.attention(q, k, v, mask, is_causal=..., enable_gqa=...)`` on torch
  tensors (default settings, untuned) vs ``F.scaled_dot_product_attention``;
* ``module``: a small ``nn.Module`` that projects nothing but lays q, k, v out as timm / Hugging Face models do
  (one packed ``(B, S, 3, H, D)`` buffer viewed as three ``(B, H, S, D)`` tensors, strided) and calls
  ``F.scaled_dot_product_attention``, under ``tracea_torch.patched(model, attention=True)`` (default
  settings: the arbiter judges each new signature on its first call; ``verdict`` names the side it chose;
  the model check's judging calls run before the timing) vs the same module unpatched.

No tuning cache is read (a fresh empty one), so this is what a new user gets. Shape classes: ``vit`` (ViT /
DeiT), ``swin`` (window attention, with the shifted-window additive mask broadcast over heads), ``maxvit``
(grid / block attention), ``bert`` (with a boolean or additive padding mask), ``decode`` (LLM one to eight
new tokens against a cache, GQA; the cache is a packed (B, KVH, S, D) tensor), ``prefill`` (causal),
``tiny`` (odd sizes). The machine (CPU model, cores, load average before and after) is printed; the 2-core
development VM is shared, so run it more than once and compare the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

import tracea
import tracea_torch
from tracea.doctor.host_plugin import host_profile
from tracea.tuning.cache import TuningCache, set_cache
from tracea_torch import arbiter, model_check


@dataclass(frozen=True)
class Case:
    """One attention call: q (b, h, sq, d), k / v (b, kvh, skv, d); ``mask``: None, "bool" (padding: the
    last keys of each sequence masked, (b, 1, 1, skv)) or "additive" (Swin's shifted-window mask, (nw,
    sq, skv) broadcast over the batch of images and the heads; or a padding mask for ``bert``)."""

    group: str
    b: int
    h: int
    kvh: int
    sq: int
    skv: int
    d: int
    causal: bool = False
    mask: str | None = None
    windows: int = 0  # swin: windows per image (the additive mask repeats every `windows` entries)

    @property
    def name(self) -> str:
        gqa = f"/{self.kvh}" if self.kvh != self.h else ""
        extra = (" causal" if self.causal else "") + (f" {self.mask} mask" if self.mask else "")
        return f"{self.group} b{self.b} h{self.h}{gqa} {self.sq}x{self.skv} d{self.d}{extra}"


CASES = [
    Case("vit", 1, 12, 12, 197, 197, 64), Case("vit", 8, 6, 6, 197, 197, 64), Case("vit", 1, 3, 3, 197, 197, 64),
    Case("vit", 8, 12, 12, 50, 50, 64), Case("vit", 1, 12, 12, 577, 577, 64),
    Case("swin", 64, 3, 3, 49, 49, 32), Case("swin", 64, 3, 3, 49, 49, 32, mask="additive", windows=64),
    Case("swin", 512, 3, 3, 49, 49, 32, mask="additive", windows=64), Case("swin", 16, 12, 12, 49, 49, 32),
    Case("swin", 4, 24, 24, 49, 49, 32, mask="additive", windows=4),
    Case("maxvit", 32, 2, 2, 49, 49, 32), Case("maxvit", 64, 4, 4, 64, 64, 32),
    Case("bert", 8, 12, 12, 128, 128, 64, mask="bool"), Case("bert", 1, 12, 12, 512, 512, 64, mask="additive"),
    Case("bert", 4, 12, 12, 256, 256, 64),
    Case("decode", 8, 3, 3, 1, 1, 128), Case("decode", 1, 32, 8, 1, 1024, 128), Case("decode", 1, 32, 8, 1, 4096, 128),
    Case("decode", 4, 8, 2, 1, 512, 64), Case("decode", 1, 32, 32, 1, 2048, 64), Case("decode", 1, 32, 8, 4, 1024, 128),
    Case("decode", 8, 8, 8, 1, 197, 48),  # XCiT class attention (one class token against all patch tokens)
    Case("prefill", 1, 8, 8, 512, 512, 64, causal=True), Case("prefill", 1, 32, 8, 128, 128, 128, causal=True),
    Case("prefill", 1, 8, 2, 2048, 2048, 64, causal=True), Case("prefill", 1, 4, 4, 100, 300, 64, causal=True),
    Case("tiny", 1, 1, 1, 1, 1, 16), Case("tiny", 2, 3, 3, 7, 7, 40), Case("tiny", 1, 4, 4, 33, 33, 80),
    Case("tiny", 2, 2, 2, 33, 7, 16, causal=True),
]


def interleaved(ours: Callable[[], Any], theirs: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """Median seconds of single calls of each side in turn (first side alternating by round), and the
    spread of the ratio: the interquartile range of the per-round ratios theirs / ours."""
    for _ in range(3):
        ours(), theirs()
    a, b = [], []
    for r in range(rounds):
        pair = ((ours, a), (theirs, b)) if r % 2 == 0 else ((theirs, b), (ours, a))
        for fn, ts in pair:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    ratios = sorted(y / x for x, y in zip(a, b))
    q = len(ratios) // 4
    return statistics.median(a), statistics.median(b), ratios[-1 - q] - ratios[q]


class Attend(torch.nn.Module):
    """SDPA on q, k, v viewed out of one (B, S, 3, H, D) buffer (timm's ViT layout), or on separate k / v
    (GQA, decode caches: q viewed out of a (B, S, H, D) buffer as Hugging Face models do)."""

    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case

    def forward(self, x: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        c = self.case
        if k is None:
            q, k, v = x.unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        else:
            q = x.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c.causal, enable_gqa=c.kvh != c.h)
        return out.transpose(1, 2)


def _mask(c: Case, dtype: torch.dtype) -> torch.Tensor | None:
    if c.mask is None:
        return None
    if c.group == "swin":  # shifted windows: -100 between regions of a window, one mask per window
        region = torch.randint(0, 4, (c.windows, c.sq))
        m = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0).to(dtype)
        return m.repeat(c.b // c.windows, 1, 1)[:, None]  # (b, 1, sq, skv): broadcast over heads
    lens = torch.randint(max(1, c.skv // 2), c.skv + 1, (c.b,))
    keep = torch.arange(c.skv)[None, :] < lens[:, None]  # padding: the tail of each sequence
    if c.mask == "bool":
        return keep[:, None, None, :]
    return torch.where(keep, 0.0, float("-inf")).to(dtype)[:, None, None, :]


def run_case(c: Case, rounds: int, dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    strided = c.kvh == c.h and c.sq == c.skv and not c.causal
    if strided:
        x = torch.randn(c.b, c.sq, 3, c.h, c.d, dtype=dtype)
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        kk = vv = None
    else:
        x = torch.randn(c.b, c.sq, c.h, c.d, dtype=dtype)
        q = x.transpose(1, 2)
        k = kk = torch.randn(c.b, c.kvh, c.skv, c.d, dtype=dtype)
        v = vv = torch.randn(c.b, c.kvh, c.skv, c.d, dtype=dtype)
    mask = _mask(c, dtype)
    gqa = c.kvh != c.h

    def torch_sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c.causal, enable_gqa=gqa)

    def ops() -> torch.Tensor:
        return tracea.ops.attention(q, k, v, mask, is_causal=c.causal, enable_gqa=gqa)

    row: dict[str, Any] = {"case": c.name}
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)),
                                             attn_mask=None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                                             is_causal=c.causal, enable_gqa=gqa)
        out = ops()
        row["rel_err"] = float((out.double() - ref).norm() / ref.norm())
        plan = _plan_runner(q, k, v, mask, c)
        if plan is not None:
            run, launch_args = plan
            row["variant"] = f"{run.decision.chosen.variant.name} {run.decision.chosen.config.key}"
            t, n, sp = interleaved(lambda: run.launch(*launch_args), torch_sdpa, rounds)
            row["kernel"] = dict(tracea_us=t * 1e6, torch_us=n * 1e6, ratio=n / t, spread=sp)
        else:
            row["variant"] = "none (no Tracea kernel)"
        t, n, sp = interleaved(ops, torch_sdpa, rounds)
        row["ops"] = dict(tracea_us=t * 1e6, torch_us=n * 1e6, ratio=n / t, spread=sp)
        model, patched_model = Attend(c), Attend(c)
        arbiter.reset()
        with tracea_torch.patched(patched_model, attention=True):
            patched_model(x, kk, vv, mask)  # the first call: the arbiter's verdict
            verdicts = [v_ for v_ in arbiter.verdicts() if v_.op.startswith("attention")]
            row["verdict"] = (f"{verdicts[-1].winner} ({verdicts[-1].tracea_s * 1e6:.1f} vs PyTorch "
                              f"{verdicts[-1].torch_s * 1e6:.1f} us)") if verdicts else "no verdict (fallback)"
            model_check.reset()  # its judging calls (patched and unpatched in turn) before the timing
            for _ in range(200):
                if model_check.verdicts():
                    break
                patched_model(x, kk, vv, mask)
            row["model_check"] = [v_.winner for v_ in model_check.verdicts()]
            t, n, sp = interleaved(lambda: patched_model(x, kk, vv, mask), lambda: model(x, kk, vv, mask), rounds)
        row["module"] = dict(tracea_us=t * 1e6, torch_us=n * 1e6, ratio=n / t, spread=sp)
    return row


def _plan_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, c: Case) -> tuple | None:
    """The runner of the plan ``tracea.ops.attention`` stored for this call, and the launcher's arguments
    (the operands as the launcher takes them, a preallocated output)."""
    from tracea.runtime.plans import lookup, signature

    key = ("attention", signature(q), signature(k), signature(v), signature(mask), signature(None), 0.0, c.causal,
           None, c.kvh != c.h, None, None)
    plan = lookup(key)
    run = getattr(plan, "runner", None)
    if run is None or run.launch is None or run.decision is None:
        return None
    kmask = None
    if mask is not None:  # the kernel's operand: (MB, MH, Sq, Skv) of q's dtype, as the plan converts it
        full = mask.expand(-1, -1, c.sq, c.skv)
        kmask = (full.to(q.dtype) if mask.dtype == torch.bool else full).contiguous()
    takes = run.decision.chosen.variant.takes_strides(run.decision.op)
    qq, kk, vv = (t if takes else t.contiguous() for t in (q, k, v))
    out = torch.empty(c.b, c.h, c.sq, c.d, dtype=q.dtype)
    return run, (qq, kk, vv, kmask, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--only", default="", help="comma-separated shape classes (default: all)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="threads for torch and Tracea (default: every core)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["TRACEA_NUM_THREADS"] = str(args.threads)
    set_cache(TuningCache(os.path.join(tempfile.mkdtemp(), "empty_cache.json")))
    prof = host_profile()
    load0 = os.getloadavg()[0]
    print(f"machine: {prof.name}, {prof.compute_units} cores, {prof.extras.get('microarch')}, best ISA "
          f"{prof.extras.get('best_isa')}; torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"{args.dtype}; rounds {args.rounds}; load average {load0:.2f}")
    print("ratio = PyTorch time / Tracea time (> 1: Tracea faster); spread: interquartile range of the per-round "
          "ratios")
    dtype = getattr(torch, args.dtype)
    only = {s for s in args.only.split(",") if s}
    rows = []
    for c in CASES:
        if only and c.group not in only:
            continue
        row = run_case(c, args.rounds, dtype)
        rows.append(row)
        parts = []
        for what in ("kernel", "ops", "module"):
            if what in row:
                r = row[what]
                parts.append(f"{what} {r['tracea_us']:8.1f}/{r['torch_us']:8.1f} us {r['ratio']:5.2f}x±{r['spread'] / 2:.2f}")
        print(f"{row['case']:<44} " + "  ".join(parts) + f"  err {row['rel_err']:.1e}  verdict {row['verdict']}",
              flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": prof.to_dict(), "dtype": args.dtype, "load_before": load0,
                       "load_after": os.getloadavg()[0], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
