"""Second slow-state probe (docs/backends/cpu.md): after the benchmark's config pick for each batch-1
NCHW ResNet-50 3x3 layer, times the picked kernel alone, after regrowing its workspace, on fresh array
copies, and four other hero configs. Run several processes:

    source scripts/srcenv.sh && for i in 1 2 3 4; do python benchmarks/cpu/probes/slow_state_configs.py; done
"""
import os, sys, dataclasses
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
def alone(op, cfg, args):
    t = BC.compare({"t": lambda: variant.run(op, cfg, args, BC.PROFILE)}, min_rounds=20, budget=0.3)
    return op.flops / t["t"][1] / 1e9
lines = []
for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
    op = Conv2dOp(1, c, hw, hw, c, 3, 3, padding=1, layout="nchw")
    x = rng.standard_normal(op.x_shape, dtype=np.float32); w = rng.standard_normal(op.w_shape, dtype=np.float32) * 0.05
    out = np.empty(op.out_shape, np.float32)
    args = OpArgs({"x": x, "w": w, "bias": None}, out, NumpyAdapter())
    cfg = BC.pick_config(variant, op, args, 0)
    a0 = alone(op, cfg, args)
    # other heroes alone
    others = {f"{h.get('mr')}x{h.get('nr')}/i{h.get('indirect')}/kc{h.get('kc')}": alone(op, h, args)
              for h in variant.hero_configs(op, BC.PROFILE)[:4]}
    # regrow the picked library's workspace, then time again
    big = dataclasses.replace(op, n=4)
    xb = rng.standard_normal(big.x_shape, dtype=np.float32); ob = np.empty(big.out_shape, np.float32)
    variant.run(big, cfg, OpArgs({"x": xb, "w": w, "bias": None}, ob, NumpyAdapter()), BC.PROFILE)
    a1 = alone(op, cfg, args)
    # fresh arrays
    x2 = x.copy(); w2 = w.copy(); o2 = np.empty_like(out)
    a2 = alone(op, cfg, OpArgs({"x": x2, "w": w2, "bias": None}, o2, NumpyAdapter()))
    lines.append(f"{c}@{hw} pick {cfg.get('mr')}x{cfg.get('nr')} kc{cfg.get('kc')}: {a0:.0f} | regrow {a1:.0f} | fresh arrays {a2:.0f} | others " + " ".join(f"{k}:{v:.0f}" for k, v in others.items()))
print(os.getpid()); print("\n".join(lines), flush=True)
