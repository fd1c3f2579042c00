"""The Hopper attention kernel's tail split (``cuda.attention.wgmma`` param ``tail``) against the same configs
without it and ``F.scaled_dot_product_attention``, side by side in one run: non-causal prefill where the
grid's last wave is partial (B4 H16 S4096: 2048 blocks of 128 rows on 132 SMs), bf16.

Usage (GPU machine, repo root): ``source scripts/srcenv.sh && python benchmarks/cuda/probe_attention_tail.py``

Prints per shape and config: kernel TFLOP/s (calls queued behind a sleep kernel, interleaved with SDPA by
rounds, medians), the ratio SDPA time / config time, the relative error against SDPA; then the user path
(``tracea.ops.attention`` default settings, back to back) beside SDPA.
"""

from __future__ import annotations

import os
import sys

import torch

import tracea
from tracea_cuda.variants.base import hero
from tracea_torch.bridge_attention import TORCH_SDPA

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import _flops, _time  # noqa: E402

SHAPES = [(4, 16, 16, 4096, 128), (4, 32, 8, 4096, 128), (4, 16, 16, 4096, 64), (2, 16, 16, 3000, 128)]


def _configs(d: int) -> dict:
    def h(bm: int, bn: int, tail: bool) -> object:
        return hero(bm, bn, d, 2, 4 * (bm // 64 + 1), pingpong=True, persistent=True, tail=tail)

    if d == 64:
        return {f"192x128 persistent{' tail' if t else ''}": h(192, 128, t) for t in (False, True)}
    return {f"{bm}x{bn} persistent{' tail' if t else ''}": h(bm, bn, t) for bm, bn in ((128, 176), (128, 128))
            for t in (False, True)}


def main() -> None:
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    for b, h, kvh, s, d in SHAPES:
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        gqa = kvh != h
        ref = TORCH_SDPA(q, k, v, enable_gqa=gqa).double()
        theirs = lambda q=q, k=k, v=v, gqa=gqa: TORCH_SDPA(q, k, v, enable_gqa=gqa)  # noqa: E731
        fl = _flops(b, h, s, s, d, False)
        cfgs = _configs(d)
        fns, errs = [], {}
        for name, cfg in cfgs.items():
            fn = lambda c=cfg, q=q, k=k, v=v, gqa=gqa: tracea.ops.attention(  # noqa: E731
                q, k, v, enable_gqa=gqa, variant="cuda.attention.wgmma", config=c)
            errs[name] = float((fn().double() - ref).norm() / ref.norm())
            fns.append(fn)
        t = _time([theirs, *fns], 10, True)
        print(f"B{b} H{h}/{kvh} S{s} D{d}: SDPA {fl / t[0] / 1e12:.0f} TF/s", flush=True)
        for (name, _), tc in zip(cfgs.items(), t[1:]):
            print(f"   {name:28s} {fl / tc / 1e12:6.0f} TF/s  {t[0] / tc:.3f}x SDPA  err {errs[name]:.1e}", flush=True)
        ours = lambda q=q, k=k, v=v, gqa=gqa: tracea.ops.attention(q, k, v, enable_gqa=gqa)  # noqa: E731
        u = _time([ours, theirs], 10, False)
        print(f"   user path (default): {u[1] / u[0]:.3f}x SDPA", flush=True)


if __name__ == "__main__":
    main()
