"""Tracea's flash-attention forward vs ``F.scaled_dot_product_attention``, side by side in one run.

Usage (on a GPU machine, from the repo root):
    source scripts/srcenv.sh && python benchmarks/cuda/bench_attention.py [--json out.json] [--quick]

Parts, each printing TFLOP/s (causal FLOPs halved) and the ratio Tracea / PyTorch:

* prefill, B4 H16 S4096, D64 / D128, and GQA B4 H32/8 S4096 D128, causal and not, bf16 / fp16, with the
  isolated kernel of each attention variant (``cuda.attention.wgmma``, ``cuda.attention.flash_mma``)
  beside the default path (``--quick``: bf16 only, no per-hero sweep);
* decode: q_len 1 (and 4 / 16) over kv_len 4096..32768, GQA 32 query / 8 kv heads, D128 / D64, batch 1 / 4,
  bf16 / fp16, with GB/s beside the copy bandwidth (``--sweep``: every decode hero and split counts);
* a small Hugging Face style transformer block (GQA attention calling SDPA, then an MLP) with
  ``tracea_torch.patch_attention()`` vs eager;
* gqa: mid-length GQA prefills (32 / 8 heads, D128, causal, 512..2048 tokens, batch 1..8);
* chunked: a prefill chunk (q_len 256..511) over a KV cache (kv_len 2k..16k), GQA 32/8 D128, causal
  top-left (``is_causal``: PyTorch's semantics when q_len != kv_len), no mask, and bottom-right (a boolean
  ``attn_mask``, as Hugging Face passes it);
* masked: padded batches with a (B, 1, S, S) boolean or additive mask (1k-4k tokens, D64 / D128, GQA and not,
  with the causal part folded into the mask or not);
* ``--only lse`` (not in the default parts): the cost of ``return_lse=True`` on a prefill and a decode shape;
* layouts: the operands as models pass them -- packed (B, H, S, D), Hugging Face's
  ``view(B, S, H, D).transpose(1, 2)`` ("bshd") and timm ViT's packed qkv ("vit") -- on ViT / BERT / Llama
  sized shapes, with the variant that served each row and whether the output came back in q's storage
  order (``out_bshd``: ``out.transpose(1, 2).reshape(B, S, H * D)`` is then a view, as with PyTorch);
* short: S 128..512 (ViT-S, BERT-base, short prefills; D64 / D128, causal and not, b1 rows) and
  mid-length prefills on small grids (1-4 sequences of 8-16 heads, 1024..2048 tokens), with the
  patched ``F.scaled_dot_product_attention`` (and the arbiter's pick) beside ``tracea.ops.attention``.

Two timings per row: the *user path* (``tracea.ops.attention`` with default settings, untuned, called back
to back between two CUDA events with nothing queued ahead: host time counts where it exceeds the
kernel's) and the *kernel* (the same calls queued behind a sleep kernel, so the events time device work
only). PyTorch is timed the same way, interleaved with Tracea round by round (medians), so clock drift
hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch import nn

import tracea
import tracea_torch
from tracea.runtime import plans
from tracea_torch.bridge_attention import TORCH_SDPA


def _time(fns, reps: int, queue_ahead: bool, rounds: int = 5) -> list[float]:
    """Median seconds per call of each fn, interleaved by rounds of ``reps`` back-to-back calls."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    per = [[] for _ in fns]
    for _ in range(rounds):
        for fn, acc in zip(fns, per):
            if queue_ahead:
                torch.cuda._sleep(20_000_000)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                fn()
            e.record()
            torch.cuda.synchronize()
            acc.append(s.elapsed_time(e) / 1e3 / reps)
    return [statistics.median(a) for a in per]


def _flops(b: int, h: int, sq: int, skv: int, d: int, causal: bool) -> float:
    pairs = sq * skv if not causal else sum(min(i + 1, skv) for i in range(sq))
    return 4.0 * b * h * pairs * d


VARIANTS = ("cuda.attention.wgmma", "cuda.attention.flash_mma")


def prefill(quick: bool, dtypes: list | None = None) -> list[dict]:
    rows = []
    dtypes = dtypes or ([torch.bfloat16] if quick else [torch.bfloat16, torch.float16])
    shapes = [(4, 16, 16, 4096, d) for d in (64, 128)] + [(4, 32, 8, 4096, 128)]  # (B, H, KVH, S, D); last: GQA
    for dt in dtypes:
        for b, h, kvh, s, d in shapes:
            for causal in (False, True):
                q = torch.randn(b, h, s, d, device="cuda", dtype=dt)
                k, v = (torch.randn(b, kvh, s, d, device="cuda", dtype=dt) for _ in range(2))
                gqa = kvh != h
                ref = TORCH_SDPA(q, k, v, is_causal=causal, enable_gqa=gqa)
                out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                err = float((out.double() - ref.double()).norm() / ref.double().norm())
                args = dict(is_causal=causal, enable_gqa=gqa)
                ours = lambda q=q, k=k, v=v, a=args: tracea.ops.attention(q, k, v, **a)  # noqa: E731
                theirs = lambda q=q, k=k, v=v, a=args: TORCH_SDPA(q, k, v, **a)  # noqa: E731
                # isolated kernel of each attention variant (default hero), beside SDPA in the same rounds
                forced = [lambda n=n, q=q, k=k, v=v, a=args: tracea.ops.attention(q, k, v, variant=n, **a)
                          for n in VARIANTS]
                user = _time([ours, theirs], 10, False)
                kern = _time([ours, theirs, *forced], 10, True)
                fl = _flops(b, h, s, s, d, causal)
                heroes = _heroes(q, k, v, causal, theirs) if not quick else {}
                rows.append(dict(part="prefill", dtype=str(dt).split(".")[1], b=b, h=h, kvh=kvh, d=d, causal=causal,
                                 tracea_tflops=fl / kern[0] / 1e12, sdpa_tflops=fl / kern[1] / 1e12,
                                 ratio_kernel=kern[1] / kern[0], ratio_user=user[1] / user[0], rel_err=err,
                                 variant=_variant(q, k, v, causal, gqa),
                                 variants={n.split(".")[-1]: f"{fl / t / 1e12:.0f} TF/s {kern[1] / t:.2f}x"
                                           for n, t in zip(VARIANTS, kern[2:])},
                                 heroes={c: round(fl / t / 1e12, 1) for c, t in heroes.items()}))
                print(_fmt(rows[-1]), flush=True)
    return rows


def _heroes(q, k, v, causal, theirs) -> dict:  # noqa: ANN001
    """Isolated-kernel time (queued ahead) of every hero config of each attention variant, by config key."""
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention import FlashAttention
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_torch.adapter import device_of

    b, h, s, d = q.shape
    kvh = k.shape[1]
    op = AttentionOp(b, h, s, s, d, kv_heads=kvh, causal=causal, dtype=str(q.dtype).split(".")[1])
    profile = get_doctor().profile_for(device_of(q.device))
    out = {}
    for var in (FlashAttentionWgmma(), FlashAttention()):
        if var.check(op, profile):
            continue
        for cfg in var.hero_configs(op, profile):
            fn = lambda c=cfg, n=var.name: tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=kvh != h,  # noqa: E731
                                                                 variant=n, config=c)
            out[f"{var.name.split('.')[-1]}:{cfg.key}"] = _time([fn, theirs], 10, True)[0]
    return out


def _variant(q, k, v, causal, gqa=False) -> str:  # noqa: ANN001
    key = ("attention", plans.signature(q), plans.signature(k), plans.signature(v), None, None, 0.0, causal, None,
           gqa, None, None)
    plan = plans.lookup(key)
    run = getattr(plan, "runner", None)
    return (run.variant or f"fallback: {run.reason}") if run is not None else "?"


def _copy_gbs() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer: the ceiling a
    memory-bound decode kernel is compared with."""
    x = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    t = _time([lambda: y.copy_(x)], 5, True, rounds=3)[0]
    return 2 * x.numel() * 2 / t / 1e9


def decode(quick: bool, dtypes: list | None = None, sweep: bool = False, masked_only: bool = False) -> list[dict]:
    """q_len 1 (and a few q_len 4 / 8 / 16 rows) over long KV caches, GQA 32 / 8 heads: the default path
    (``cuda.attention.decode`` on sm_80+), its isolated kernel, flash_mma's split-KV kernel, SDPA, and at
    q_len 1 the patched ``F.scaled_dot_product_attention`` (user path, the arbiter's pick);
    GB/s of K and V read beside the copy bandwidth. ``sweep``: every decode hero and forced split counts.
    ``masked_only``: only padding-mask rows and the same shapes without the mask."""
    from tracea_cuda.variants.attention import FlashAttention

    rows = []
    copy = _copy_gbs()
    print(f"device-to-device copy: {copy:.0f} GB/s (read + write)", flush=True)
    dtypes = dtypes or ([torch.bfloat16] if quick else [torch.bfloat16, torch.float16])
    shapes = [(b, 1, skv, d, False) for d in (128, 64) for b in (1, 4)
              for skv in ((4096, 32768) if quick else (4096, 8192, 16384, 32768))]
    shapes += [(1, 4, 8192, 128, False), (1, 8, 8192, 128, False), (4, 8, 4096, 128, False),
               (1, 16, 8192, 128, False), (4, 1, 8192, 128, True)]  # last: an HF-style padding mask
    if masked_only:
        shapes = [(b, 1, skv, 128, m) for b, skv in ((4, 8192), (1, 32768), (8, 4096)) for m in (False, True)]
    for dt in dtypes:
        for b, sq, skv, d, masked in shapes:
            q = torch.randn(b, 32, sq, d, device="cuda", dtype=dt)
            k, v = (torch.randn(b, 8, skv, d, device="cuda", dtype=dt) for _ in range(2))
            mask = None
            if masked:  # additive (B, 1, 1, kv): the first keys of each sequence are padding
                mask = torch.zeros(b, 1, 1, skv, device="cuda", dtype=dt)
                for i in range(b):
                    mask[i, ..., : 100 * i] = torch.finfo(dt).min
            ref = TORCH_SDPA(q, k, v, mask, enable_gqa=True)
            out = tracea.ops.attention(q, k, v, mask, enable_gqa=True)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            ours = lambda q=q, k=k, v=v, m=mask: tracea.ops.attention(q, k, v, m, enable_gqa=True)  # noqa: E731
            theirs = lambda q=q, k=k, v=v, m=mask: TORCH_SDPA(q, k, v, m, enable_gqa=True)  # noqa: E731
            fmma = lambda q=q, k=k, v=v, m=mask: tracea.ops.attention(q, k, v, m, enable_gqa=True,  # noqa: E731
                                                                      variant=FlashAttention.name)
            user = _time([ours, theirs], 20, False)
            kern = _time([ours, theirs, fmma], 20, True)
            gbytes = 2 * b * 8 * skv * d * 2 / 1e9
            row = dict(part="decode", dtype=str(dt).split(".")[1], b=b, sq=sq, kv=skv, d=d, mask=masked,
                       tracea_us=kern[0] * 1e6, sdpa_us=kern[1] * 1e6, flash_mma_us=kern[2] * 1e6,
                       tracea_gbs=gbytes / kern[0], sdpa_gbs=gbytes / kern[1], copy_share=gbytes / kern[0] / copy,
                       ratio_kernel=kern[1] / kern[0], ratio_user=user[1] / user[0], user_us=user[0] * 1e6,
                       sdpa_user_us=user[1] * 1e6, rel_err=err, variant=_variant_of(q, k, v, mask))
            if sq == 1:  # the patched F.scaled_dot_product_attention (the arbiter's pick on its first call)
                tracea_torch.patch_attention()
                try:
                    patched = lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(  # noqa: E731
                        q, k, v, m, enable_gqa=True)
                    patched()
                    pt = _time([patched, theirs], 20, False)
                    row.update(ratio_patched=pt[1] / pt[0], patched_winner=_winner_of(_runner_of(q, k, v, mask)))
                finally:
                    tracea_torch.unpatch_attention()
            if sweep and dt == dtypes[0] and sq == 1 and skv in (4096, 32768) and not masked:
                row["configs_us"] = _decode_sweep(q, k, v, theirs)
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


def lse_cost(quick: bool) -> list[dict]:
    """The log-sum-exp output's cost: ``tracea.ops.attention(..., return_lse=True)`` against the same call
    without it and SDPA (kernel: queued behind a sleep kernel; user path: back to back), bf16, prefill
    B4 H16 S4096 D128 and decode q_len 1 GQA 32/8 batch 4 kv 8192."""
    rows = []
    for b, h, kvh, sq, skv, d in ((4, 16, 16, 4096, 4096, 128), (4, 32, 8, 1, 8192, 128)):
        q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        plain = lambda q=q, k=k, v=v: tracea.ops.attention(q, k, v, enable_gqa=True)  # noqa: E731
        with_lse = lambda q=q, k=k, v=v: tracea.ops.attention(q, k, v, enable_gqa=True, return_lse=True)  # noqa: E731
        theirs = lambda q=q, k=k, v=v: TORCH_SDPA(q, k, v, enable_gqa=True)  # noqa: E731
        kern = _time([plain, with_lse, theirs], 10, True)
        user = _time([plain, with_lse, theirs], 10, False)
        rows.append(dict(part="lse", b=b, h=h, kvh=kvh, sq=sq, kv=skv, d=d, plain_us=kern[0] * 1e6,
                         lse_us=kern[1] * 1e6, sdpa_us=kern[2] * 1e6, lse_cost_kernel=kern[1] / kern[0],
                         ratio_lse_kernel=kern[2] / kern[1], ratio_lse_user=user[2] / user[1]))
        print(_fmt(rows[-1]), flush=True)
    return rows


LAYOUT_SHAPES = [  # (B, H, KVH, S, D, dtype, causal): ViT-S/16, BERT-base, a 1k-token Llama-style prefill, GQA
    (32, 6, 6, 197, 64, torch.float16, False), (8, 12, 12, 256, 64, torch.bfloat16, False),
    (1, 16, 16, 1024, 128, torch.bfloat16, False), (1, 16, 16, 1024, 128, torch.bfloat16, True),
    (1, 32, 8, 2048, 128, torch.bfloat16, True),
]


def _laid_out(kind: str, b: int, h: int, kvh: int, s: int, d: int, dt: torch.dtype) -> tuple:
    """q, k, v of logical shapes (B, H, S, D) / (B, KVH, S, D) in memory layout ``kind``."""
    if kind == "packed":
        return (torch.randn(b, h, s, d, device="cuda", dtype=dt),
                *(torch.randn(b, kvh, s, d, device="cuda", dtype=dt) for _ in range(2)))
    if kind == "bshd":
        return (torch.randn(b, s, h, d, device="cuda", dtype=dt).transpose(1, 2),
                *(torch.randn(b, s, kvh, d, device="cuda", dtype=dt).transpose(1, 2) for _ in range(2)))
    return tuple(torch.randn(b, s, 3, h, d, device="cuda", dtype=dt).permute(2, 0, 3, 1, 4).unbind(0))  # vit


def layouts(quick: bool) -> list[dict]:
    """``tracea.ops.attention`` vs SDPA on packed, BSHD and ViT-qkv operands (same tensors for both)."""
    rows = []
    for b, h, kvh, s, d, dt, causal in LAYOUT_SHAPES[:3] if quick else LAYOUT_SHAPES:
        for kind in ("packed", "bshd") + (("vit",) if h == kvh else ()):
            q, k, v = _laid_out(kind, b, h, kvh, s, d, dt)
            gqa = kvh != h
            ours = lambda q=q, k=k, v=v, c=causal, g=gqa: tracea.ops.attention(q, k, v, is_causal=c, enable_gqa=g)  # noqa: E731
            theirs = lambda q=q, k=k, v=v, c=causal, g=gqa: TORCH_SDPA(q, k, v, is_causal=c, enable_gqa=g)  # noqa: E731
            out, ref = ours(), theirs()
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            kern = _time([ours, theirs], 20, True)
            user = _time([ours, theirs], 20, False)
            key = ("attention", plans.signature(q), plans.signature(k), plans.signature(v), plans.signature(None),
                   None, 0.0, causal, None, gqa, None, None)
            run = getattr(plans.lookup(key), "runner", None)
            rows.append(dict(part="layouts", layout=kind, b=b, h=h, kvh=kvh, s=s, d=d, dtype=str(dt).split(".")[1],
                             causal=causal, tracea_us=kern[0] * 1e6, sdpa_us=kern[1] * 1e6,
                             ratio_kernel=kern[1] / kern[0], user_tracea_us=user[0] * 1e6, user_sdpa_us=user[1] * 1e6,
                             ratio_user=user[1] / user[0], out_bshd=bool(out.transpose(1, 2).is_contiguous()),
                             variant=(run.variant or "fallback") if run is not None else "?", rel_err=err))
            print(_fmt(rows[-1]), flush=True)
    return rows


SHORT_SHAPES = [  # (B, H, S, D, dtype, causal, layout): ViT-S / BERT-base / short prefills, D64 and D128, b1 rows
    (32, 6, 197, 64, torch.float16, False, "vit"), (1, 6, 197, 64, torch.float16, False, "vit"),
    (8, 12, 256, 64, torch.bfloat16, False, "bshd"), (32, 12, 128, 64, torch.bfloat16, False, "packed"),
    (16, 12, 384, 64, torch.bfloat16, False, "bshd"), (8, 16, 512, 64, torch.bfloat16, False, "packed"),
    (8, 12, 256, 64, torch.bfloat16, True, "bshd"), (8, 16, 512, 64, torch.bfloat16, True, "bshd"),
    (32, 16, 128, 128, torch.bfloat16, False, "bshd"), (16, 12, 197, 128, torch.float16, False, "vit"),
    (8, 16, 256, 128, torch.bfloat16, False, "packed"), (8, 16, 384, 128, torch.bfloat16, True, "bshd"),
    (4, 32, 512, 128, torch.bfloat16, True, "bshd"), (1, 16, 512, 128, torch.bfloat16, False, "packed"),
    # D128 at other short lengths (the heroes' rules, not these shapes, pick the tiles)
    (64, 12, 77, 128, torch.bfloat16, True, "bshd"), (64, 12, 77, 128, torch.bfloat16, False, "bshd"),
    (16, 16, 257, 128, torch.bfloat16, True, "packed"), (16, 12, 257, 128, torch.float16, False, "vit"),
    (8, 16, 500, 128, torch.bfloat16, True, "bshd"), (8, 16, 500, 128, torch.bfloat16, False, "packed"),
    # mid-length prefills on small grids (past 512 keys; the long heroes' row blocks fill few waves)
    (2, 16, 1024, 64, torch.bfloat16, False, "packed"), (4, 16, 1024, 64, torch.bfloat16, True, "bshd"),
    (1, 8, 1536, 64, torch.float16, False, "packed"), (1, 8, 1024, 128, torch.bfloat16, False, "packed"),
    (2, 16, 1024, 128, torch.bfloat16, False, "packed"), (1, 16, 2048, 128, torch.bfloat16, True, "packed"),
]


def short(quick: bool) -> list[dict]:
    """Short sequences (S 128..512) as ViT / BERT / small prefills pass them, and mid-length prefills on
    small grids (S 1024..2048, 1-4 sequences): the kernel (default path,
    queued ahead) and two user paths -- ``tracea.ops.attention`` and the patched
    ``F.scaled_dot_product_attention`` (the arbiter's pick on its first call, named) -- each against SDPA."""
    rows = []
    for b, h, s, d, dt, causal, kind in SHORT_SHAPES:
        q, k, v = _laid_out(kind, b, h, h, s, d, dt)
        ours = lambda q=q, k=k, v=v, c=causal: tracea.ops.attention(q, k, v, is_causal=c)  # noqa: E731
        theirs = lambda q=q, k=k, v=v, c=causal: TORCH_SDPA(q, k, v, is_causal=c)  # noqa: E731
        out, ref = ours(), theirs()
        err = float((out.double() - ref.double()).norm() / ref.double().norm())
        kern = _time([ours, theirs], 20, True)
        user = _time([ours, theirs], 20, False)
        run = _runner_of(q, k, v, None, causal, False)
        row = dict(part="short", layout=kind, b=b, h=h, s=s, d=d, dtype=str(dt).split(".")[1], causal=causal,
                   tracea_us=kern[0] * 1e6, sdpa_us=kern[1] * 1e6, ratio_kernel=kern[1] / kern[0],
                   user_tracea_us=user[0] * 1e6, user_sdpa_us=user[1] * 1e6, ratio_user=user[1] / user[0],
                   variant=(run.variant or "fallback") if run is not None else "?", rel_err=err)
        tracea_torch.patch_attention()
        try:
            patched = lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)  # noqa: E731
            patched()
            pt = _time([patched, theirs], 20, False)
            row.update(ratio_patched=pt[1] / pt[0], patched_winner=_winner_of(run))
        finally:
            tracea_torch.unpatch_attention()
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


GQA_SHAPES = [  # (B, S): 32 query heads over 8 kv heads, D128, causal, bf16 (Llama-style prefills of 512..2048)
    (1, 512), (1, 1024), (1, 2048), (2, 1024), (4, 512), (4, 1024), (4, 2048), (8, 2048),
]


def _pair_row(part: str, ours, theirs, fl: float, extra: dict, reps: int = 20) -> dict:  # noqa: ANN001
    """Kernel time (queued ahead) and user path (back to back) of ``ours`` vs ``theirs``, their outputs'
    relative error, the variant that served ``ours``."""
    out, ref = ours(), theirs()
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    kern = _time([ours, theirs], reps, True)
    user = _time([ours, theirs], reps, False)
    return dict(part=part, **extra, tracea_us=kern[0] * 1e6, sdpa_us=kern[1] * 1e6,
                tracea_tflops=fl / kern[0] / 1e12, ratio_kernel=kern[1] / kern[0], user_tracea_us=user[0] * 1e6,
                user_sdpa_us=user[1] * 1e6, ratio_user=user[1] / user[0], rel_err=err)


def gqa(quick: bool) -> list[dict]:
    """Mid-length GQA prefills (32 query / 8 kv heads, D128, causal, bf16, 512..2048 tokens, batch 1..8):
    ``tracea.ops.attention`` vs SDPA, both with ``enable_gqa=True`` (packed (B, H, S, D) operands; the
    last row also as Hugging Face's BSHD views)."""
    rows = []
    shapes = [(b, s, "packed") for b, s in GQA_SHAPES] + [(4, 1024, "bshd")]
    for b, s, kind in shapes:
        q, k, v = _laid_out(kind, b, 32, 8, s, 128, torch.bfloat16)
        rows.append(_sdpa_row("gqa", q, k, v, dict(is_causal=True), _flops(b, 32, s, s, 128, True),
                              dict(layout=kind, b=b, h=32, kvh=8, s=s, d=128, causal=True)))
    return rows


def _sdpa_row(part: str, q, k, v, kw: dict, flops: float, extra: dict) -> dict:  # noqa: ANN001
    """One row: ``tracea.ops.attention`` against PyTorch's SDPA with the same keyword arguments (GQA
    enabled) through :func:`_pair_row`, the variant that served it, printed."""
    kw = dict(kw, enable_gqa=True)
    row = _pair_row(part, lambda: tracea.ops.attention(q, k, v, **kw), lambda: TORCH_SDPA(q, k, v, **kw), flops,
                    extra)
    run = _runner_of(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False), True)
    row["variant"] = (run.variant or f"fallback: {run.reason}") if run is not None else "?"
    print(_fmt(row), flush=True)
    return row


CHUNKED_SHAPES = [  # (B, q_len, kv_len): a prefill chunk over a KV cache, GQA 32/8, D128, bf16
    (1, 256, 2048), (1, 511, 4096), (1, 256, 8192), (1, 511, 16384), (4, 256, 4096), (2, 384, 8192),
]


def chunked(quick: bool) -> list[dict]:
    """Chunked prefill: q_len 256..511 over kv_len 2k..16k, GQA 32/8, D128, bf16, three ways of asking:

    * ``causal=top-left``: ``is_causal=True``, PyTorch's (and Tracea's) semantics for q_len != kv_len (query i
      sees keys 0..i, so only the first q_len keys take part: not what a chunked prefill wants);
    * ``causal=none``: every key visible (a chunk attending to a cache of earlier tokens only);
    * ``causal=bottom-right``: the chunk's queries are the cache's last q_len positions (query i sees keys
      0..kv_len - q_len + i), as Hugging Face passes it: a boolean (q_len, kv_len) ``attn_mask`` to both sides.
    """
    rows = []
    for b, sq, skv in CHUNKED_SHAPES:
        q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, 8, skv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lower_right = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril(skv - sq)
        for how in ("top-left", "none", "bottom-right"):
            kw = dict(is_causal=how == "top-left", attn_mask=lower_right if how == "bottom-right" else None)
            pairs = (sq * (sq + 1) // 2 if how == "top-left" else
                     sq * skv - sq * (sq - 1) // 2 if how == "bottom-right" else sq * skv)
            rows.append(_sdpa_row("chunked", q, k, v, kw, 4.0 * b * 32 * pairs * 128,
                                  dict(b=b, h=32, kvh=8, sq=sq, kv=skv, d=128, causal=how)))
    return rows


MASKED_SHAPES = [  # (B, H, KVH, S, D, mask kind, causal): padded batches (Hugging Face passes a (B, 1, S, S) mask)
    (4, 32, 8, 2048, 128, "bool", False), (4, 32, 8, 2048, 128, "bool", True), (2, 16, 16, 4096, 128, "additive", False),
    (4, 16, 16, 2048, 64, "bool", False), (8, 12, 12, 1024, 64, "additive", False), (2, 32, 8, 1000, 128, "bool", True),
]


def masked(quick: bool) -> list[dict]:
    """Masked prefill: batches of sequences padded to a common length with a (B, 1, S, S) boolean (keys past
    each sequence's length hidden; with ``causal`` the mask also holds the causal part, as Hugging Face's
    padded batches do) or additive mask (``finfo.min`` on the padding), bf16, GQA and not, D64 / D128."""
    rows = []
    for b, h, kvh, s, d, kind, causal in MASKED_SHAPES:
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lengths = torch.tensor([s - (i * s) // (2 * b) for i in range(b)], device="cuda")
        keep = (torch.arange(s, device="cuda")[None, :] < lengths[:, None])[:, None, None, :].expand(b, 1, s, s)
        if causal:
            keep = keep & torch.ones(s, s, dtype=torch.bool, device="cuda").tril()
        keep = keep.contiguous()
        mask = keep if kind == "bool" else torch.zeros(b, 1, s, s, dtype=torch.bfloat16, device="cuda").masked_fill(
            ~keep, torch.finfo(torch.bfloat16).min)
        rows.append(_sdpa_row("masked", q, k, v, dict(attn_mask=mask), _flops(b, h, s, s, d, False),
                              dict(b=b, h=h, kvh=kvh, s=s, d=d, mask=kind, causal=causal)))
    return rows


def _runner_of(q, k, v, mask=None, causal=False, gqa=True):  # noqa: ANN001, ANN202
    key = ("attention", plans.signature(q), plans.signature(k), plans.signature(v), plans.signature(mask), None, 0.0,
           causal, None, gqa, None, None)
    return getattr(plans.lookup(key), "runner", None)


def _variant_of(q, k, v, mask=None) -> str:  # noqa: ANN001
    run = _runner_of(q, k, v, mask)
    return (run.variant or f"fallback: {run.reason}") if run is not None else "?"


def _winner_of(run) -> str:  # noqa: ANN001
    """The arbiter's verdict on the op ``run`` serves (the patched SDPA judged it on its first call)."""
    op = getattr(run, "op", None)
    desc = op.describe() if op is not None else None
    return next((v.winner for v in tracea_torch.arbiter.verdicts() if v.op == desc), "?")


def _decode_sweep(q, k, v, theirs) -> dict:  # noqa: ANN001
    """Isolated-kernel microseconds of each decode hero (auto splits) and of the first hero at forced
    split counts."""
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_decode import FlashDecode
    from tracea_cuda.variants.base import hero
    from tracea_torch.adapter import device_of

    b, h, sq, d = q.shape
    op = AttentionOp(b, h, sq, k.shape[2], d, kv_heads=k.shape[1], dtype=str(q.dtype).split(".")[1])
    profile = get_doctor().profile_for(device_of(q.device))
    var = FlashDecode()
    heroes = var.hero_configs(op, profile)
    first = heroes[0]
    configs = heroes + [hero(16, first.tile_n, d, first.stages, first.warps, splits=n) for n in (4, 8, 16, 32)]
    out = {}
    for cfg in configs:
        fn = lambda c=cfg: tracea.ops.attention(q, k, v, enable_gqa=True, variant=var.name, config=c)  # noqa: E731
        splits = var.spec(op, cfg, None, profile).splits
        out[f"{cfg.key}/s{splits}"] = round(_time([fn, theirs], 20, True)[0] * 1e6, 1)
    return out


class Block(nn.Module):
    """A Llama-style block: GQA self-attention through F.scaled_dot_product_attention, then an MLP."""

    def __init__(self, dim: int = 2048, heads: int = 16, kv_heads: int = 4) -> None:
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.n1(x)
        q = self.q(y).view(b, s, self.h, self.hd).transpose(1, 2)
        k, v = self.kv(y).view(b, s, 2, self.kvh, self.hd).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(self.n2(x))))


def model(quick: bool) -> list[dict]:
    rows = []
    blk = Block().cuda().to(torch.bfloat16).eval()
    for b, s in ((4, 2048),) if quick else ((4, 2048), (1, 4096)):
        x = torch.randn(b, s, 2048, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ref = blk(x)
            tracea_torch.patch_attention(blk)
            out = blk(x)  # first call: plans, the arbiter's verdict
            patched = lambda x=x: blk(x)  # noqa: E731
            t = _time([patched, eager_unpatched(blk, x)], 5, False)
            tracea_torch.unpatch_attention(blk)
        err = float((out.double() - ref.double()).norm() / ref.double().norm())
        verdicts = [f"{v.winner} ({v.op})" for v in tracea_torch.arbiter.verdicts()]
        rows.append(dict(part="hf_block", b=b, s=s, ratio_user=t[1] / t[0], patched_ms=t[0] * 1e3,
                         eager_ms=t[1] * 1e3, rel_err=err, arbiter=verdicts[-2:]))
        print(_fmt(rows[-1]), flush=True)
    return rows


def eager_unpatched(blk: nn.Module, x: torch.Tensor):  # noqa: ANN201
    """The block's forward with PyTorch's SDPA even while the block is patched."""
    fwd = type(blk).forward

    def run() -> torch.Tensor:
        return fwd(blk, x)

    return run


def _fmt(r: dict) -> str:
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="prefill,decode,model,layouts,short,gqa,chunked,masked")
    ap.add_argument("--dtypes", help="prefill / decode dtypes, comma-separated (default: bfloat16, and float16 "
                    "unless --quick)")
    ap.add_argument("--sweep", action="store_true", help="decode: time every hero and forced split counts")
    ap.add_argument("--masked", action="store_true", help="decode: only padding-mask rows and their unmasked twins")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    rows = []
    for part in args.only.split(","):
        dts = [getattr(torch, t) for t in args.dtypes.split(",")] if args.dtypes else None
        if part == "prefill":
            rows += prefill(args.quick, dts)
            continue
        if part == "decode":
            rows += decode(args.quick, dts, args.sweep, args.masked)
            continue
        rows += {"prefill": prefill, "decode": decode, "model": model, "lse": lse_cost, "layouts": layouts,
                 "short": short, "gqa": gqa, "chunked": chunked, "masked": masked}[part](args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
