"""Diagnostic: what the im2col gather costs. Times the Hopper conv (cp.async gather of A) against the
Hopper GEMM with the same M, N, K (TMA-fed A) for ResNet-50 layers, each at its best of a few configs.

    python benchmarks/cuda/probe_conv_gather.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_cuda import VARIANTS, n_sets, timed  # noqa: E402
from tracea.ir.ops import Conv2dOp, GemmOp  # noqa: E402
from tracea_cuda import testing as T  # noqa: E402


def best(variant, op, inputs) -> tuple[float, str]:
    profile = T.gpu_profile()
    out = (float("inf"), "")
    space = [c for c in variant.search_space(op, profile)
             if c.get("group_m") == 8 and c.get("smem_epilogue") and c.tile_n <= 128 and c.stages == 6 + (c.tile_n == 64)]
    for config in space:
        args = [T.op_args(t) for t in inputs]
        sec = timed(lambda i: variant.run(op, config, args[i], profile), len(inputs), reps=10, warmup=2)
        out = min(out, (sec, config.key))
    return out


def main() -> None:
    conv_v, gemm_v = VARIANTS["cuda.conv2d.wgmma"], VARIANTS["cuda.gemm.wgmma"]
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        op = Conv2dOp(32, c, hw, hw, c, 3, 3, padding=1, layout="nhwc", dtype="bfloat16")
        m, n, k = op.gemm_mnk
        g = GemmOp(m, n, k, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")
        cs, cc = best(conv_v, op, [T.conv_inputs(op, seed=i) for i in range(n_sets(op.min_bytes))])
        gs, gc = best(gemm_v, g, [T.gemm_inputs(g, seed=i) for i in range(n_sets(g.min_bytes))])
        print(f"{c}@{hw}: conv {op.flops / cs / 1e12:6.1f} TF/s [{cc}]  gemm {g.flops / gs / 1e12:6.1f} TF/s [{gc}]",
              flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
