"""Run every hero configuration of every CUDA variant once, on small odd and aligned shapes, and check
each output against the float64 reference. Meant to run under compute-sanitizer (GPU machine):

    compute-sanitizer --tool memcheck --error-exitcode 9 python scripts/memcheck_heroes.py --json out.json

``--bound`` runs each through the launcher ``variant.bind`` returns for torch tensors (what ``tracea.ops``
and patched layers call: pointer-only launches, pre-passes into scratch) instead of ``variant.run``.
Without the sanitizer it is a quick correctness sweep over the heroes. Prints one line per
(variant, op, config) and a summary; exit code 1 when an output is wrong or a run raises something other
than a declined config."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tracea.ir.ops import Conv2dOp, GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

# Shapes small enough for memcheck (it slows kernels ~100x) but covering edges: odd M/N/K, K below one
# tile, rows TMA cannot address (pitched copies), few rows (skinny), few tiles with a long K, batches, transposes, every math mode, 1x1 / 3x3 / strided convs in both layouts.
GEMMS = []
for dt, prec in (("float16", "highest"), ("bfloat16", "highest"), ("float32", "high"), ("float32", "highest")):
    for (m, n, k, b, ta, tb) in ((129, 200, 72, 1, False, False), (64, 256, 256, 2, True, True),
                                 (333, 97, 264, 1, False, True), (512, 512, 512, 1, False, False),
                                 (3, 1000, 333, 1, False, True), (1, 4096, 1024, 1, False, True),
                                 (13, 520, 264, 1, False, True), (130, 300, 8192, 1, False, True),
                                 (40, 777, 336, 1, False, True), (100, 136, 2056, 1, False, True),  # few rows
                                 (5, 301, 1030, 1, False, False), (16, 2052, 700, 1, False, False),  # (K, N) B
                                 (24, 520, 264, 1, False, False), (56, 300, 1030, 1, False, True)):
        GEMMS.append(GemmOp(m, n, k, batch=b, trans_a=ta, trans_b=tb, dtype_a=dt, dtype_b=dt, fp32_precision=prec,
                            epilogue="bias+gelu"))
CONVS = []
for dt, prec in (("float16", "highest"), ("bfloat16", "highest"), ("float32", "high"), ("float32", "highest")):
    for layout in ("nhwc", "nchw"):
        CONVS += [Conv2dOp(2, 64, 15, 13, 64, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision=prec,
                           epilogue="bias+relu"),
                  Conv2dOp(1, 128, 14, 14, 256, 1, 1, layout=layout, dtype=dt, fp32_precision=prec),
                  Conv2dOp(3, 32, 17, 17, 64, 3, 3, stride=2, padding=1, layout=layout, dtype=dt,
                           fp32_precision=prec, epilogue="bias"),
                  Conv2dOp(4, 256, 7, 7, 512, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision=prec),
                  Conv2dOp(2, 3, 19, 17, 16, 7, 7, stride=2, padding=3, layout=layout, dtype=dt,  # RGB stem
                           fp32_precision=prec, epilogue="bias+relu"),
                  Conv2dOp(1, 96, 9, 7, 136, 3, 3, padding=1, layout=layout, dtype=dt,  # few tiles: split-K
                           fp32_precision=prec, epilogue="bias"),
                  Conv2dOp(3, 21, 9, 7, 13, 1, 1, layout=layout, dtype=dt, fp32_precision=prec,  # pointwise,
                           epilogue="bias+relu"),  # odd planes and channels
                  Conv2dOp(2, 32, 12, 12, 16, 1, 1, layout=layout, dtype=dt, fp32_precision=prec),
                  Conv2dOp(2, 16, 9, 11, 40, 3, 3, padding=1, layout=layout, dtype=dt,  # C below one slice
                           fp32_precision=prec, epilogue="bias+relu"),
                  Conv2dOp(2, 40, 9, 11, 24, 3, 3, padding=1, layout=layout, dtype=dt,  # C in 16-byte runs only:
                           fp32_precision=prec, epilogue="bias"),  # K-tiles straddle (r, s)
                  Conv2dOp(1, 3, 256, 260, 16, 5, 5, padding=2, layout=layout, dtype=dt,  # padded stem, M >= 65536
                           fp32_precision=prec),
                  Conv2dOp(3, 64, 7, 7, 72, 1, 1, layout=layout, dtype=dt, fp32_precision=prec,  # 1x1 on planes
                           epilogue="bias+relu"),  # whose NCHW rows need a pitched copy (wgmma_nchw1x1)
                  Conv2dOp(2, 48, 10, 7, 40, 1, 1, layout=layout, dtype=dt, fp32_precision=prec, epilogue="bias"),
                  Conv2dOp(6, 96, 1, 1, 40, 1, 1, layout=layout, dtype=dt, fp32_precision=prec,  # pooled head:
                           epilogue="bias+relu")]  # pooled_gemm on the GEMM variants


# Big shapes only to collect the heroes the Doctor proposes there (bigger tiles, clusters, stream-K, the
# deferred epilogue); those configs then run on the small shapes above, where edges are exercised.
HARVEST = [GemmOp(4096, 4096, 4096, dtype_a=dt, dtype_b=dt, fp32_precision=prec, epilogue=epi, trans_b=tb)
           for dt, prec in (("float16", "highest"), ("bfloat16", "highest"), ("float32", "high"), ("float32", "highest"))
           for epi in ("bias+gelu", "none") for tb in (False, True)]
HARVEST += [GemmOp(512, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # few-tile heroes
            GemmOp(128, 2048, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # 128x64 split (H200)
            GemmOp(4, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # few-block skinny heroes
            GemmOp(16, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),
            GemmOp(512, 5120, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # fill widths:
            GemmOp(512, 13824, 5120, trans_b=True, dtype_a="float16", dtype_b="float16"),  # 128x160, 128x224,
            GemmOp(256, 5120, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # 128x80
            GemmOp(1000, 1000, 1000, dtype_a="float16", dtype_b="float16"),  # 128x64 (MN-major B),
            GemmOp(128, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # 128x32 and
            GemmOp(128, 5120, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # 128x48 (one row tile)
            GemmOp(32, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # few-row heroes:
            GemmOp(64, 11008, 4096, trans_b=True, dtype_a="float16", dtype_b="float16"),  # ping-pong, whole,
            GemmOp(48, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # split
            GemmOp(24, 4096, 4096, trans_b=True), GemmOp(64, 4096, 4096, trans_b=True),  # skinny_tf32 row classes
            GemmOp(40, 4096, 4097, trans_b=True)]  # rows_fma (every tile height, K split, one float per copy)
HARVEST += [Conv2dOp(32, c, hw, hw, c, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision=prec, epilogue="bias+relu")
            for dt, prec in (("float16", "highest"), ("float32", "high"), ("float32", "highest"))
            for layout in ("nhwc", "nchw") for c, hw in ((64, 56), (256, 14), (512, 7))]
HARVEST += [Conv2dOp(1, 512, 7, 7, 512, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision="high")
            for dt, layout in (("float16", "nhwc"), ("float32", "nchw"), ("float32", "nhwc"))]  # split-K heroes
HARVEST += [Conv2dOp(n, 32, 112, 112, 16, 1, 1, layout=layout, dtype=dt, fp32_precision="high")
            for n in (1, 32) for dt, layout in (("float16", "nhwc"), ("float32", "nchw"))]  # pointwise heroes
HARVEST += [Conv2dOp(n, c, hw, hw, k, 1, 1, layout="nchw", dtype="bfloat16", epilogue="bias")  # wgmma_nchw1x1
            for n in (1, 32) for c, hw, k in ((64, 56, 256), (1024, 14, 256), (2048, 7, 512), (144, 56, 24))]


def plan(variant, profile, per_config: int = 2) -> list:
    """(op, config) pairs: every small op with its first hero, and every hero collected on any shape on
    up to ``per_config`` small ops it is valid for."""
    is_conv = variant.name.startswith("cuda.conv2d")
    small = [op for op in (CONVS if is_conv else GEMMS) if not variant.check(op, profile)]
    pairs, seen = [], set()
    for op in small:
        heroes = [c for c in variant.hero_configs(op, profile) if variant.validate_config(op, c, profile)]
        if heroes:
            pairs.append((op, heroes[0]))
            seen.add((op.describe(), heroes[0].key))
    configs = {}
    for op in small + [h for h in HARVEST if isinstance(h, Conv2dOp) == is_conv and not variant.check(h, profile)]:
        for c in variant.hero_configs(op, profile):
            configs.setdefault(c.key, c)
    for key, config in configs.items():
        used = 0
        for op in small:
            if used >= per_config:
                break
            if (op.describe(), key) in seen or not variant.validate_config(op, config, profile):
                continue
            pairs.append((op, config))
            seen.add((op.describe(), key))
            used += 1
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the per-run results here")
    ap.add_argument("--variant", action="append", help="only these variant names")
    ap.add_argument("--bound", action="store_true", help="launch through variant.bind (the plan path)")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th pair from i (warm the compile cache in parallel)")
    args = ap.parse_args()
    shard, nshards = (int(x) for x in args.shard.split("/"))
    import torch

    profile = T.gpu_profile()
    adapter = None
    if args.bound:
        from tracea.doctor.doctor import get_doctor

        adapter = next(a for a in get_doctor().adapters() if a.name == "torch")

    def launch(variant, op, config, t) -> None:  # noqa: ANN001
        if adapter is None:
            variant.run(op, config, T.op_args(t), profile)
            return
        r0, r1 = op.roles[:2]
        variant.bind(op, config, profile, adapter)(t[r0], t[r1], t.get("bias"), t["out"])

    rows, bad, index = [], 0, 0
    t0 = time.time()
    for variant in all_variants():
        if args.variant and variant.name not in args.variant:
            continue
        for op, config in plan(variant, profile):
            index += 1
            if (index - 1) % nshards != shard:
                continue
            row = {"variant": variant.name, "op": op.describe(), "config": config.key, "bound": bool(args.bound)}
            try:
                if isinstance(op, GemmOp):
                    t = T.gemm_inputs(op, seed=index)
                    launch(variant, op, config, t)
                    ref = T.gemm_reference(op, t)
                    mode = math_mode(op.dtype_a, op.fp32_precision)
                else:
                    t = T.conv_inputs(op, seed=index)
                    launch(variant, op, config, t)
                    ref = T.conv_reference(op, t)
                    mode = math_mode(op.dtype, op.fp32_precision)
                torch.cuda.synchronize()
                err, tol = T.rel_err(t["out"], ref), T.tolerance(mode, op.out_dtype)
                row.update(err=err, ok=bool(err <= tol))
            except Exception as exc:  # noqa: BLE001 - reported per run
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
            bad += not row["ok"]
            rows.append(row)
            print(("ok  " if row["ok"] else "BAD ") + f"{row['variant']:26s} {row['op'][:64]:64s} {row['config']}"
                  + (f"  err={row['err']:.2e}" if "err" in row else f"  {row.get('error', '')}"), flush=True)
    n_configs = len({(r["variant"], r["config"]) for r in rows})
    print(f"{len(rows)} runs, {n_configs} distinct (variant, hero config), {bad} bad, {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "bad": bad}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
