"""Short-sequence attention probe: ``cuda.attention.wgmma`` configs on the shapes ViT / BERT / small-LLM
prefills have (S 128..512, D64 / D128), against ``F.scaled_dot_product_attention`` in one process.

Per shape it prints which kernel SDPA runs (the CUDA kernel names one call launches, from the profiler) and
the time of each forced SDPA backend, then for every config (the variant's heroes and the candidate tiles
below) the isolated kernel's time (queued behind a sleep kernel: device time) and its ratio to SDPA's,
the default path's kernel ratio and its *user path* ratio (``tracea.ops.attention`` with default settings,
untuned, back to back, host time counted) and ``flash_mma``'s default. Each output is checked against SDPA's.

    python benchmarks/cuda/probe_attention_short.py [--shapes vit,bert,...|mid] [--json out.json] [--no-sweep]

``--shapes mid``: the mid-length prefills on small grids (640..2048 tokens, 1-4 sequences of 8-16 heads,
D64 / D128, causal and not), where the long heroes' row blocks fill few waves of the SMs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import sys
from pathlib import Path
from typing import Any

import torch

import tracea
from tracea_torch.bridge_attention import TORCH_SDPA

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import _flops, _laid_out, _time  # noqa: E402

#: name -> (B, H, S, D, dtype, causal, layout)
SHAPES = {
    "vit": (32, 6, 197, 64, torch.float16, False, "vit"),
    "vit_b1": (1, 6, 197, 64, torch.float16, False, "vit"),
    "vit_packed": (32, 6, 197, 64, torch.float16, False, "packed"),
    "bert": (8, 12, 256, 64, torch.bfloat16, False, "bshd"),
    "s128": (32, 12, 128, 64, torch.bfloat16, False, "packed"),
    "s384": (16, 12, 384, 64, torch.bfloat16, False, "bshd"),
    "s512": (8, 16, 512, 64, torch.bfloat16, False, "packed"),
    "s512c": (8, 16, 512, 64, torch.bfloat16, True, "bshd"),
    "d128_s256": (8, 16, 256, 128, torch.bfloat16, False, "packed"),
    "d128_s512c": (4, 32, 512, 128, torch.bfloat16, True, "bshd"),
    "d128_s384c": (8, 16, 384, 128, torch.bfloat16, True, "bshd"),
    "d128_s197": (16, 12, 197, 128, torch.float16, False, "vit"),
    "b1_s512": (1, 16, 512, 128, torch.bfloat16, False, "packed"),
    "bert_c": (8, 12, 256, 64, torch.bfloat16, True, "bshd"),
    "d128_s128": (32, 16, 128, 128, torch.bfloat16, False, "bshd"),
    "gqa_s512c": (4, 32, 512, 128, torch.bfloat16, True, "gqa"),
    "long_s1024_d64": (2, 16, 1024, 64, torch.bfloat16, False, "packed"),
    "long_s1024": (1, 16, 1024, 128, torch.bfloat16, False, "packed"),
    # mid-length prefills on small grids (past SHORT_KV; the long heroes' row blocks fill 0.5-3 waves)
    "m64_1x16x1024": (1, 16, 1024, 64, torch.bfloat16, False, "packed"),
    "m64_4x16x1024": (4, 16, 1024, 64, torch.bfloat16, False, "packed"),
    "m64_1x16x2048": (1, 16, 2048, 64, torch.bfloat16, False, "packed"),
    "m64_2x16x2048": (2, 16, 2048, 64, torch.bfloat16, False, "packed"),
    "m64_1x8x1536": (1, 8, 1536, 64, torch.float16, False, "packed"),
    "m64c_2x16x1024": (2, 16, 1024, 64, torch.bfloat16, True, "packed"),
    "m64c_4x16x1024": (4, 16, 1024, 64, torch.bfloat16, True, "packed"),
    "m64c_1x16x2048": (1, 16, 2048, 64, torch.bfloat16, True, "packed"),
    "m128_1x8x1024": (1, 8, 1024, 128, torch.bfloat16, False, "packed"),
    "m128_2x16x1024": (2, 16, 1024, 128, torch.bfloat16, False, "packed"),
    "m128_1x8x2048": (1, 8, 2048, 128, torch.bfloat16, False, "packed"),
    "m128_2x16x1536": (2, 16, 1536, 128, torch.bfloat16, False, "packed"),
    "m128c_1x16x1024": (1, 16, 1024, 128, torch.bfloat16, True, "packed"),
    "m128c_2x16x1024": (2, 16, 1024, 128, torch.bfloat16, True, "packed"),
    "m128c_1x16x2048": (1, 16, 2048, 128, torch.bfloat16, True, "packed"),
    "m128c_4x8x768": (4, 8, 768, 128, torch.float16, True, "packed"),
    # D128 short lengths around the tiles (77..500 keys), causal and not
    "d128_s77c": (64, 12, 77, 128, torch.bfloat16, True, "bshd"),
    "d128_s257c": (16, 16, 257, 128, torch.bfloat16, True, "packed"),
    "d128_s500c": (8, 16, 500, 128, torch.bfloat16, True, "bshd"),
    "d128_s128c": (32, 16, 128, 128, torch.bfloat16, True, "packed"),
    "d128_s77": (64, 12, 77, 128, torch.bfloat16, False, "bshd"),
    "d128_s257": (16, 12, 257, 128, torch.float16, False, "vit"),
    "d128_s500": (8, 16, 500, 128, torch.bfloat16, False, "packed"),
    # mid-length GQA prefills, 32 query / 8 kv heads (``gqa4``: 4 query heads per kv head), causal
    "g_1x512c": (1, 32, 512, 128, torch.bfloat16, True, "gqa4"),
    "g_4x512c": (4, 32, 512, 128, torch.bfloat16, True, "gqa4"),
    "g_1x1024c": (1, 32, 1024, 128, torch.bfloat16, True, "gqa4"),
    "g_2x1024c": (2, 32, 1024, 128, torch.bfloat16, True, "gqa4"),
    "g_4x2048c": (4, 32, 2048, 128, torch.bfloat16, True, "gqa4"),
    "g_8x2048c": (8, 32, 2048, 128, torch.bfloat16, True, "gqa4"),
    # chunked prefill: (..., kv_len) q_len chunks over a longer KV cache, GQA 32/8, no mask
    "ch_1x256x8192": (1, 32, 256, 128, torch.bfloat16, False, "gqa4", 8192),
    "ch_1x511x16384": (1, 32, 511, 128, torch.bfloat16, False, "gqa4", 16384),
    "ch_4x256x4096": (4, 32, 256, 128, torch.bfloat16, False, "gqa4", 4096),
    "ch_1x256x2048c": (1, 32, 256, 128, torch.bfloat16, True, "gqa4", 2048),
    "ch_4x256x4096c": (4, 32, 256, 128, torch.bfloat16, True, "gqa4", 4096),
    "ch_1x256x4096": (1, 32, 256, 128, torch.bfloat16, False, "gqa4", 4096),
    "l_4x16x4096c": (4, 16, 4096, 128, torch.bfloat16, True, "packed"),
}
#: the mid-length shapes (``--shapes mid``)
MID = [n for n in SHAPES if n.startswith("m") and n[1:4] in ("64_", "64c", "128")] + ["long_s1024_d64", "long_s1024"]


def candidates(d: int, causal: bool = False) -> list[Any]:
    """The short-sequence tiles tried beside the heroes: one consumer warpgroup (tile_m 64) with two or
    three CTAs per SM, two-warpgroup tiles, and the O tile staged in shared memory (``ostage``); at D128
    (``TRACEA_PROBE_SET=2``) the 128-row staged tile over 64..160-key tiles, causal with the old and the
    longest-first (``lpt``) item order, and the tail split on small grids."""
    import os
    from tracea_cuda.variants.base import hero

    def c1(bn: int, st: int, ctas: int, **kw: Any) -> Any:
        return hero(64, bn, d, st, 8, pingpong=False, ctas=ctas, **kw)

    def c2(bn: int, st: int, **kw: Any) -> Any:
        return hero(128, bn, d, st, 12, pingpong=True, **kw)

    if d == 128 and os.environ.get("TRACEA_PROBE_SET") == "2":
        if causal:  # persistent ones: lpt (balanced pairs of blocks, snake-dealt) unless lpt=False
            return [c2(128, 2, persistent=True, ostage=True), c2(128, 2, persistent=True, ostage=True, lpt=False),
                    c2(128, 2, ostage=True), c2(128, 2, ostage=True, lpt=True), c2(128, 2, persistent=True),
                    c2(96, 2, persistent=True, ostage=True), c2(112, 2, persistent=True, ostage=True),
                    c2(64, 2, persistent=True, ostage=True), c1(64, 2, 2, persistent=True, ostage=True),
                    c1(64, 2, 2, persistent=True, ostage=True, lpt=False), c1(64, 2, 2, ostage=True), c2(128, 2),
                    c2(176, 2, persistent=True)]
        return [c2(bn, 2, persistent=True, ostage=True) for bn in (64, 96, 112, 144, 160)] + [
            c2(128, 2, persistent=True, tail=True), c2(128, 2, persistent=True, tail=True, ostage=True),
            c2(160, 2, persistent=True, tail=True), c1(64, 2, 2, persistent=True, ostage=True),
            c1(112, 1, 2, persistent=True, ostage=True), c1(64, 2, 2, persistent=True, tail=True)]
    if d == 64:
        return [c1(64, 2, 3), c1(64, 2, 3, persistent=True), c1(80, 2, 3, persistent=True),
                c1(64, 2, 3, ostage=True), c1(80, 2, 3, persistent=True, ostage=True),
                c1(128, 2, 2, persistent=True), c1(128, 2, 2, persistent=True, ostage=True),
                c1(96, 2, 3, persistent=True, ostage=True), c1(64, 2, 3, persistent=True, ostage=True),
                c2(128, 3, ostage=True), c2(128, 3, persistent=True, ostage=True),
                c1(128, 2, 2), c1(128, 2, 2, ostage=True), c1(96, 2, 2, persistent=True)]
    return [c1(64, 2, 2), c1(64, 2, 2, persistent=True), c1(80, 2, 2, persistent=True),
            c1(128, 1, 2, persistent=True), c1(128, 1, 2), c2(128, 2, persistent=True),
            c1(64, 2, 2, ostage=True), c1(64, 2, 2, persistent=True, ostage=True),
            c1(80, 2, 2, persistent=True, ostage=True), c1(96, 1, 2, persistent=True, ostage=True),
            c1(128, 1, 2, persistent=True, ostage=True), c1(128, 1, 2, ostage=True),
            c2(128, 2, persistent=True, ostage=True), c2(128, 2, persistent=True, tail=True, ostage=True),
            c2(128, 2, ostage=True), c2(64, 2, ostage=True), c2(96, 2, ostage=True), c2(176, 2, ostage=True)]


def _compile_one(item: tuple[str, str, str]) -> None:
    from tracea_cuda import compiler

    compiler.precompile(*item)


def _source(var: Any, op: Any, cfg: Any) -> tuple[str, str, str]:
    spec = var.spec(op, cfg)
    em = var.emitter
    return em.render(spec), em.KERNEL_NAME, "sm_90a"


def sdpa_kernels(fn: Any) -> list[str]:
    """The CUDA kernels one call of ``fn`` launches (profiler names)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in prof.events() if e.device_type.name == "CUDA"})


def probe(names: list[str], sweep: bool) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea.runtime import attention_strides as ast
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_torch.adapter import device_of

    var = FlashAttentionWgmma()
    profile = get_doctor().profile_for(device_of(torch.device("cuda")))
    plan = []
    for name in names:
        b, h, s, d, dt, causal, layout = SHAPES[name][:7]
        skv = SHAPES[name][7] if len(SHAPES[name]) > 7 else s
        kvh = h // 4 if layout in ("gqa", "gqa4") else h  # "gqa": packed, 4 query heads per kv head
        q, k, v = _laid_out("packed" if layout in ("gqa", "gqa4") else layout, b, h, kvh, s, d, dt)
        if skv != s:
            k, v = (torch.randn(b, kvh, skv, d, device="cuda", dtype=dt) for _ in range(2))
        strides = None
        if layout not in ("packed", "gqa"):
            trip = [ast.fold(t.shape, t.stride()) for t in (q, k, v)]
            out_t = (s * h * d, d, h * d)  # the output in q's (BSHD-like) storage order
            strides = (*trip[0], *trip[1], *trip[2], *out_t)
        op = AttentionOp(b, h, s, skv, d, kv_heads=kvh, causal=causal, dtype=str(dt).split(".")[1], strides=strides)
        cfgs, seen = [], set()
        for c in var.hero_configs(op, profile) + (candidates(d, causal) if sweep else []):
            if c.key not in seen and var.validate_config(op, c, profile):
                seen.add(c.key)
                cfgs.append(c)
        plan.append((name, q, k, v, causal, op, cfgs))
    items = {}
    for *_, op, cfgs in plan:
        for c in cfgs:
            src = _source(var, op, c)
            items[src[:2]] = src
    with cf.ProcessPoolExecutor(max_workers=16, mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_one, items.values()))
    print(f"precompiled {len(items)} kernels", flush=True)

    rows = []
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    for name, q, k, v, causal, _op, cfgs in plan:
        b, h, s, d = q.shape
        fl = _flops(b, h, s, k.shape[2], d, causal)
        g = k.shape[1] != h
        theirs = lambda q=q, k=k, v=v, c=causal, g=g: TORCH_SDPA(q, k, v, is_causal=c, enable_gqa=g)  # noqa: E731
        ref = theirs().double()
        forced = {}
        for bname, be in backends.items():
            def run(q=q, k=k, v=v, c=causal, be=be, g=g) -> Any:
                with sdpa_kernel([be]):
                    return TORCH_SDPA(q, k, v, is_causal=c, enable_gqa=g)
            try:
                run()
                forced[bname] = run
            except RuntimeError:
                pass
        ours = lambda q=q, k=k, v=v, c=causal, g=g: tracea.ops.attention(q, k, v, is_causal=c, enable_gqa=g)  # noqa: E731
        fmma = lambda q=q, k=k, v=v, c=causal, g=g: tracea.ops.attention(  # noqa: E731
            q, k, v, is_causal=c, enable_gqa=g, variant="cuda.attention.flash_mma")
        fns = [theirs, ours, fmma, *forced.values()]
        labels = ["sdpa", "default", "flash_mma", *(f"sdpa[{n}]" for n in forced)]
        errs = {}
        for cfg in cfgs:
            fn = lambda c=cfg, q=q, k=k, v=v, cz=causal, g=g: tracea.ops.attention(  # noqa: E731
                q, k, v, is_causal=cz, enable_gqa=g, variant=var.name, config=c)
            try:
                out = fn()
            except Exception as exc:  # noqa: BLE001
                print(f"    {cfg.key}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            errs[cfg.key] = float((out.double() - ref).norm() / ref.norm())
            fns.append(fn)
            labels.append(cfg.key)
        kern = _time(fns, 20, True)
        user = _time([ours, theirs], 20, False)
        out = ours()
        row = dict(shape=name, b=b, h=h, kvh=k.shape[1], s=s, d=d, dtype=str(q.dtype).split(".")[1], causal=causal,
                   sdpa_us=round(kern[0] * 1e6, 2), sdpa_tflops=round(fl / kern[0] / 1e12, 1),
                   sdpa_runs=sdpa_kernels(theirs), ratio_user=round(user[1] / user[0], 3),
                   user_us=round(user[0] * 1e6, 2), sdpa_user_us=round(user[1] * 1e6, 2),
                   default_err=float((out.double() - ref).norm() / ref.norm()),
                   times={lab: [round(t * 1e6, 2), round(kern[0] / t, 3)] for lab, t in zip(labels[1:], kern[1:])},
                   errs=errs)
        rows.append(row)
        print(f"{name} b{b} h{h} s{s} d{d} {row['dtype']} causal={int(causal)}: sdpa {row['sdpa_us']} us "
              f"({row['sdpa_tflops']} TF/s) runs {row['sdpa_runs']}; user path {row['ratio_user']}x "
              f"({row['user_us']} vs {row['sdpa_user_us']} us)", flush=True)
        for lab, (us, ratio) in row["times"].items():
            e = errs.get(lab)
            print(f"    {lab:72s} {us:8.2f} us  {ratio:.3f}x" + (f"  err {e:.1e}" if e is not None else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-sweep", action="store_true", help="only the heroes (no candidate tiles)")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    names = [n for part in args.shapes.split(",") for n in (MID if part == "mid" else [part])]
    rows = probe(names, not args.no_sweep)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
