"""Reproduces the CPU conv "slow state" (docs/backends/cpu.md): the bench's flow for the batch-1 ResNet-50
3x3 layers (config pick among the heroes, float64 check, torch interleaved), then each NCHW row's
GFLOP/s interleaved with torch and alone. Run several processes:

    source scripts/srcenv.sh && for i in 1 2 3; do python benchmarks/cpu/probes/slow_state_probe.py; done
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bench_cpu as BC
import numpy as np
from tracea.ir.ops import Conv2dOp
from tracea.doctor.variant import OpArgs
from tracea.runtime.arrays import NumpyAdapter
from tracea_cpu.variants import CpuConv2dVariant
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.testing import conv2d_ref
torch = BC.torch_mod(2)
variant = CpuConv2dVariant(ISA_BY_NAME["avx512"])
rng = np.random.default_rng(1)
out_s = []
for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
    for layout in ("nchw", "nhwc"):
        op = Conv2dOp(1, c, hw, hw, c, 3, 3, padding=1, layout=layout)
        x = rng.standard_normal(op.x_shape, dtype=np.float32); w = rng.standard_normal(op.w_shape, dtype=np.float32) * 0.05
        out = np.empty(op.out_shape, np.float32)
        args = OpArgs({"x": x, "w": w, "bias": None}, out, NumpyAdapter())
        cfg = BC.pick_config(variant, op, args, 0)
        variant.run(op, cfg, args, BC.PROFILE)
        conv2d_ref(x, w, op)
        tx = torch.from_numpy(x if layout == "nchw" else x.transpose(0, 3, 1, 2))
        tw = torch.from_numpy(w if layout == "nchw" else w.transpose(0, 3, 1, 2))
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        tx, tw = tx.contiguous(memory_format=fmt), tw.contiguous(memory_format=fmt)
        def run_torch(tx=tx, tw=tw):
            with torch.no_grad():
                torch.nn.functional.conv2d(tx, tw, padding=1)
        t = BC.compare({"tracea": lambda: variant.run(op, cfg, args, BC.PROFILE), "torch": run_torch})
        alone = BC.compare({"tracea": lambda: variant.run(op, cfg, args, BC.PROFILE)})
        if layout == "nchw":
            out_s.append(f"{c}@{hw} mr{cfg.get('mr')}: {op.flops/t['tracea'][0]/1e9:.0f} (alone {op.flops/alone['tracea'][0]/1e9:.0f}) torch {op.flops/t['torch'][0]/1e9:.0f}")
print(os.getpid(), " | ".join(out_s), flush=True)
