"""bf16 CPU attention: Q K^T on ``vdpbf16ps`` (bf16 pairs, the default where the CPU has AVX512_BF16) against the
same kernel with its operands widened to fp32 for the FMAs (``TRACEA_CPU_BF16_DOT=0``), and PyTorch's bf16 SDPA,
through ``tracea.ops.attention`` (untuned, default configs), one call of each in turn per round (medians).

    source scripts/srcenv.sh && python benchmarks/cpu/probes/attention_bf16_dot.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import tracea
from tracea.runtime import plans
from tracea_cpu import attention

SHAPES = {  # name: (batch, heads, kv_heads, seq_q, seq_kv, head_dim)
    "vit b1 h12 197 d64": (1, 12, 12, 197, 197, 64),
    "vit b8 h6 197 d64": (8, 6, 6, 197, 197, 64),
    "vit b1 h12 577 d64": (1, 12, 12, 577, 577, 64),
    "swin b64 h3 49 d32": (64, 3, 3, 49, 49, 32),
    "bert b4 h12 256 d64": (4, 12, 12, 256, 256, 64),
    "prefill b1 h32/8 512 d128": (1, 32, 8, 512, 512, 128),
}


def _runner(dot: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool):
    os.environ["TRACEA_CPU_BF16_DOT"] = "1" if dot else "0"
    attention._attention_plan.cache_clear()
    plans.invalidate("probe")
    tracea.ops.attention(q, k, v, enable_gqa=gqa)  # builds the plan with this setting
    key = ("attention", plans.signature(q), plans.signature(k), plans.signature(v), plans.signature(None),
           plans.signature(None), 0.0, False, None, gqa, None, None)
    plan = plans.lookup(key)
    assert plan is not None
    return lambda: plan(q, k, v, None, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; AVX512_BF16 dot available: "
          f"{attention._host_has_bf16_dot()}")
    for name, (b, h, kvh, sq, skv, d) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        q = torch.randn(b, h, sq, d, generator=g).bfloat16()
        k, v = (torch.randn(b, kvh, skv, d, generator=g).bfloat16() for _ in range(2))
        gqa = kvh != h
        sides = {"dot": _runner(True, q, k, v, gqa), "widened": _runner(False, q, k, v, gqa),
                 "torch": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)}
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=gqa)
        errs = {s: float((f().double() - ref).norm() / ref.norm()) for s, f in sides.items()}
        times: dict[str, list[float]] = {s: [] for s in sides}
        order = list(sides)
        for r in range(args.rounds):
            for s in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                sides[s]()
                times[s].append(time.perf_counter() - t0)
        med = {s: statistics.median(t) * 1e6 for s, t in times.items()}
        print(f"{name:<28} dot {med['dot']:8.1f} us  widened {med['widened']:8.1f} us  torch {med['torch']:8.1f} us"
              f"  dot/widened {med['widened'] / med['dot']:.2f}x  torch/dot {med['torch'] / med['dot']:.2f}x  "
              f"err dot {errs['dot']:.1e} widened {errs['widened']:.1e}", flush=True)
    os.environ.pop("TRACEA_CPU_BF16_DOT", None)


if __name__ == "__main__":
    main()
