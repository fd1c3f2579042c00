"""The conv layers that ran below 0.9x cuDNN on the untuned user path (batch-1 small-spatial 3x3, pointwise
layers with few channels, the RGB stem): per layer, which variant and config the Doctor picks, and, in one
run on the same tensors, the user path (``tracea.ops.conv2d`` back to back, host time included) and the
device time alone (20 calls captured in a CUDA graph, replayed) of

- ``default``: what ``tracea.ops.conv2d`` runs untuned;
- ``previous``: the default before this probe's changes (the wgmma conv's first non-split hero, or
  ``cuda.conv2d.implicit_mma``'s first hero where the pointwise variant or the wgmma conv's gather of
  channels below one 128-byte slice -- padded RGB stems, C = 8 / 16 / 32 -- is now chosen);
- ``torch``: ``F.conv2d`` (cuDNN; float32 with ``torch.backends.cudnn.allow_tf32`` as set, TF32 by default).

    python benchmarks/cuda/probe_conv_small.py [--json out.json]

Ratios are torch time / Tracea time. Tracea follows the same flag: TF32 where cuDNN may use it; the
pointwise variant computes in exact fp32 FMA either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

import tracea
from tracea.doctor.doctor import get_doctor
from tracea.ir.ops import Conv2dOp

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/user_path")
from bench_shapes import paired  # noqa: E402
from probe_split_k import graph_time  # noqa: E402  (20 calls in one CUDA graph, median of 5 replays)

# (label, n, c, k, hw, r, stride, dtype, channels_last)
LAYERS = [("resnet 512->512 3x3 @7^2", 1, 512, 512, 7, 3, 1, torch.float32, False),
          ("resnet 256->256 3x3 @14^2", 1, 256, 256, 14, 3, 1, torch.float32, False),
          ("resnet 512->512 3x3 @7^2", 32, 512, 512, 7, 3, 1, torch.float32, False),
          ("resnet 512->512 3x3 @7^2", 1, 512, 512, 7, 3, 1, torch.float16, True),
          ("resnet 128->128 3x3 @28^2", 1, 128, 128, 28, 3, 1, torch.float16, True),
          ("unet 512->256 3x3 @32^2", 1, 512, 256, 32, 3, 1, torch.float32, False),
          ("mobilenet 32->16 1x1 @112^2", 32, 32, 16, 112, 1, 1, torch.float32, False),
          ("mobilenet 96->24 1x1 @56^2", 32, 96, 24, 56, 1, 1, torch.float32, False),
          ("mobilenet 32->16 1x1 @112^2", 32, 32, 16, 112, 1, 1, torch.float16, True),
          ("mobilenet 32->16 1x1 @112^2", 1, 32, 16, 112, 1, 1, torch.float32, False),
          ("mobilenet 240->40 1x1 @28^2", 32, 240, 40, 28, 1, 1, torch.float32, False),
          ("mobilenet 96->24 1x1 @56^2", 32, 96, 24, 56, 1, 1, torch.float16, True),
          ("resnet stem 3->64 7x7/2 @224^2", 1, 3, 64, 224, 7, 2, torch.float16, True),
          ("resnet stem 3->64 7x7/2 @224^2", 32, 3, 64, 224, 7, 2, torch.float16, True),
          ("resnet stem 3->64 7x7/2 @224^2", 32, 3, 64, 224, 7, 2, torch.bfloat16, True),
          ("mobilenet-like 32->64 3x3 @112^2", 32, 32, 64, 112, 3, 1, torch.float16, True),
          ("small-C 16->64 3x3 @56^2", 32, 16, 64, 56, 3, 1, torch.float32, False)]


def breakdown(fn: Callable[[], Any], calls: int = 10) -> str:
    """Device time per call of each kernel / memset ``fn`` launches (torch profiler, CUPTI: CuPy's and
    torch's launches alike), longest first."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for ka in prof.key_averages():
        us = float(getattr(ka, "self_device_time_total", 0) or getattr(ka, "self_cuda_time_total", 0) or 0)
        if us > 0:
            per[ka.key[:40]] = per.get(ka.key[:40], 0.0) + us / calls
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:4])


def previous(op: Conv2dOp, chosen: Any) -> tuple[str, Any] | None:
    """The variant and config the untuned default ran before split-K / the pointwise variant."""
    name = chosen.variant.name
    slice_c = 128 // op.dtype.storage.itemsize
    if name in ("cuda.conv2d.wgmma", "cuda.conv2d.pointwise") and (op.c % slice_c or name.endswith("pointwise")):
        # channels below one 128-byte slice (padded stems, C = 8 / 16 / 32) and pointwise layers ran on mma.sync
        v = {v.name: v for v in get_doctor().variants()}["cuda.conv2d.implicit_mma"]
        return v.name, v.hero_configs(op, get_doctor().profile_for("cuda:0"))[0]
    if name == "cuda.conv2d.wgmma":
        old = [c for c in chosen.variant.hero_configs(op, get_doctor().profile_for("cuda:0"))
               if int(c.get("split_k") or 1) == 1]
        return (name, old[0]) if old else None
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
          f"(float32: cuDNN {'TF32' if torch.backends.cudnn.allow_tf32 else 'fp32'}, Tracea the same flag)")
    rows = []
    for label, n, c, k, hw, r, s, dt, cl in LAYERS:
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=dt).contiguous(memory_format=fmt)
        w = (torch.randn(k, c, r, r, device="cuda", dtype=dt) / (c * r * r) ** 0.5).contiguous(memory_format=fmt)
        b = torch.randn(k, device="cuda", dtype=dt)
        pad = r // 2
        op = Conv2dOp(n, c, hw, hw, k, r, r, stride=s, padding=pad, layout="nhwc" if cl else "nchw",
                      dtype=str(dt)[6:], fp32_precision="high" if torch.backends.cudnn.allow_tf32 else "highest",
                      epilogue="bias")
        d = get_doctor().decide(op, "cuda:0")
        chosen = d.chosen
        ours = lambda: tracea.ops.conv2d(x, w, b, stride=s, padding=pad)  # noqa: E731, B023
        theirs = lambda: F.conv2d(x, w, b, stride=s, padding=pad)  # noqa: E731, B023
        ref = F.conv2d(x.double(), w.double(), b.double(), stride=s, padding=pad)
        err = float((ours().double() - ref).norm() / ref.norm())
        t, a, _ = paired(ours, theirs)
        gt, ga = graph_time(ours), graph_time(theirs)
        row = {"layer": f"{label} b{n} {str(dt)[6:]}{' CL' if cl else ''}", "variant": chosen.variant.name,
               "config": chosen.config.key if chosen.config is not None else "", "user_s": t, "torch_user_s": a,
               "graph_s": gt, "torch_graph_s": ga, "rel_err": err}
        prev = previous(op, chosen)
        if prev is not None:
            old = lambda: tracea.ops.conv2d(x, w, b, stride=s, padding=pad,  # noqa: E731, B023
                                            variant=prev[0], config=prev[1])  # noqa: B023
            tp, _, _ = paired(old, theirs)
            row.update(prev_variant=prev[0], prev_config=prev[1].key, prev_user_s=tp, prev_graph_s=graph_time(old))
        rows.append(row)
        line = (f"{row['layer']:<44} {chosen.variant.name[12:]:<12} user {t * 1e6:7.1f} us vs torch {a * 1e6:7.1f} "
                f"({a / t:4.2f}x)  device {gt * 1e6:7.1f} vs {ga * 1e6:7.1f} ({ga / gt:4.2f}x)  err {err:.1e}")
        if prev is not None:
            line += (f"  | previous {prev[0][12:]}: user {row['prev_user_s'] * 1e6:7.1f} ({a / row['prev_user_s']:4.2f}x)"
                     f" device {row['prev_graph_s'] * 1e6:7.1f} ({ga / row['prev_graph_s']:4.2f}x)")
        print(line, flush=True)
        row["kernels_us"] = breakdown(ours)
        print(f"    kernels (us/call): {row['kernels_us']}", flush=True)
        print(f"    config {row['config']}; ranked: " + ", ".join(
            f"{cand.variant.name[12:]} {cand.estimate_s * 1e6:.1f} us" for cand in d.candidates[:4]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
