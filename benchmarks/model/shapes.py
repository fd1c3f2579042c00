"""The shape families the performance model is fitted and judged on, with their fit / held-out split.

Held-out families are never used to fit the shipped data: their shapes (other model sizes, other
CNNs, other random odd sizes) are unseen by the model, so ``eval_model.py`` measures how it
generalises. A family is held out whole, never a sample of its shapes.
"""

from __future__ import annotations

import random

from tracea.ir.ops import Conv2dOp, GemmOp

#: (N_out, K_in) of the qkv, MLP-up and MLP-down projections of LLMs (x @ W.T, W stored (N, K))
LLM = {
    "llama7b": [(12288, 4096), (11008, 4096), (4096, 11008)],
    "mistral7b": [(6144, 4096), (14336, 4096), (4096, 14336)],
    "llama70b": [(10240, 8192), (28672, 8192), (8192, 28672)],
    "tinyllama": [(2560, 2048), (5632, 2048), (2048, 5632)],
    "gpt2": [(2304, 768), (3072, 768), (768, 3072)],
    "llama13b": [(15360, 5120), (13824, 5120), (5120, 13824)],
    "qwen7b": [(4608, 3584), (18944, 3584), (3584, 18944)],
    "phi2": [(7680, 2560), (10240, 2560), (2560, 10240)],
}
HELD_OUT = {"llama13b", "qwen7b", "phi2", "odd-b", "batched-b", "square-b", "vgg", "densenet", "resnet-strided"}

PREFILL_M = (512, 4096)
DECODE_M = (1, 16, 32, 64, 96, 128)
#: (family, label, C, H=W, K, R, stride, padding)
CONVS = [
    ("resnet", "3x3 64@56", 64, 56, 64, 3, 1, 1), ("resnet", "3x3 128@28", 128, 28, 128, 3, 1, 1),
    ("resnet", "3x3 256@14", 256, 14, 256, 3, 1, 1), ("resnet", "3x3 512@7", 512, 7, 512, 3, 1, 1),
    ("resnet", "1x1 64->256@56", 64, 56, 256, 1, 1, 0), ("resnet", "1x1 256->64@56", 256, 56, 64, 1, 1, 0),
    ("resnet", "stem 7x7/2 3->64@224", 3, 224, 64, 7, 2, 3),
    ("mobilenet", "1x1 96->24@56", 96, 56, 24, 1, 1, 0), ("mobilenet", "1x1 192->64@28", 192, 28, 64, 1, 1, 0),
    ("unet", "3x3 64@128", 64, 128, 64, 3, 1, 1), ("unet", "3x3 128->256@32", 128, 32, 256, 3, 1, 1),
    ("vgg", "3x3 64->128@112", 64, 112, 128, 3, 1, 1), ("vgg", "3x3 256@56", 256, 56, 256, 3, 1, 1),
    ("densenet", "3x3 128->32@56", 128, 56, 32, 3, 1, 1), ("densenet", "1x1 256->128@28", 256, 28, 128, 1, 1, 0),
    # late-stage 1x1 layers with many input channels (2026-11-27: nothing measured within reach of them sent
    # batch-1 channels_last ResNet-50 1x1 layers to implicit_mma at 0.51-1.06x cuDNN, wgmma ran 0.95-1.44x)
    ("resnet", "1x1 512->128@28", 512, 28, 128, 1, 1, 0), ("resnet", "1x1 1024->256@14", 1024, 14, 256, 1, 1, 0),
    ("resnet", "1x1 2048->512@7", 2048, 7, 512, 1, 1, 0), ("resnet", "1x1 512->2048@7", 512, 7, 2048, 1, 1, 0),
    ("mobilenet", "1x1 960->160@7", 960, 7, 160, 1, 1, 0), ("mobilenet", "1x1 672->112@14", 672, 14, 112, 1, 1, 0),
    ("densenet", "1x1 1024->128@14", 1024, 14, 128, 1, 1, 0),
    ("resnet-strided", "3x3/2 128@56", 128, 56, 128, 3, 2, 1), ("resnet-strided", "3x3/2 256@28", 256, 28, 256, 3, 2, 1),
]
GEMM_PRECISIONS = {"bf16": dict(dtype_a="bfloat16", dtype_b="bfloat16"),
                   "fp16": dict(dtype_a="float16", dtype_b="float16"),
                   "fp32-tf32": dict(fp32_precision="high"), "fp32-exact": dict(fp32_precision="highest")}


def _odd(seed: int, n: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(tuple(int(round(2 ** rng.uniform(6.5, 12.5))) for _ in range(3)))
    return out


def gemm_cases(gpu: bool = True) -> list[tuple[str, str, GemmOp]]:
    """(family, precision label, op) of every GEMM case. ``gpu``: the GPU sizes; else a CPU-sized subset."""
    cases: list[tuple[str, str, GemmOp]] = []
    precs = list(GEMM_PRECISIONS) if gpu else ["fp32"]
    for fam, projs in LLM.items():
        for n, k in projs:
            for m in (PREFILL_M + DECODE_M) if gpu else (1, 16, 128, 512):
                if not gpu and n * k > 40e6:
                    continue
                for p in precs:
                    # fp16 and the fp32 modes on a subset: keeps one device call short
                    if gpu and p != "bf16" and m not in (1, 128, 4096):
                        continue
                    if gpu and p.startswith("fp32") and fam in ("llama70b",) and m == 4096:
                        continue
                    kw = GEMM_PRECISIONS.get(p, {})
                    cases.append((fam, p, GemmOp(m, n, k, trans_b=True, **kw)))
    squares = [256, 512, 1024, 2048, 4096, 8192] if gpu else [128, 256, 384, 512, 768, 1024, 1536, 2048]
    squares_b = [768, 1536, 3072, 6144] if gpu else [320, 640, 896, 1280, 1792]
    odd_a = _odd(1, 12 if gpu else 10) + [(3000, 5000, 777), (1000, 1000, 1000)]
    odd_b = _odd(2, 8 if gpu else 8) + [(999, 4097, 1023)]
    if not gpu:
        odd_a = [t for t in odd_a if t[0] * t[1] * t[2] <= 3e9]
        odd_b = [t for t in odd_b if t[0] * t[1] * t[2] <= 3e9]
    for fam, shapes in (("square", [(s, s, s) for s in squares]), ("square-b", [(s, s, s) for s in squares_b]),
                        ("odd-a", odd_a), ("odd-b", odd_b)):
        for m, n, k in shapes:
            for p in precs:
                cases.append((fam, p, GemmOp(m, n, k, **GEMM_PRECISIONS.get(p, {}))))
    batched = [(32, 512, 512, 512), (64, 128, 128, 64), (8, 1024, 1024, 1024), (16, 256, 4096, 256)]
    batched_b = [(64, 512, 512, 512), (12, 2048, 2048, 128), (48, 197, 64, 197)]
    if not gpu:
        batched = [(8, 256, 256, 256), (32, 128, 128, 64), (4, 512, 512, 512)]
        batched_b = [(16, 256, 256, 256), (12, 197, 64, 197)]
    for fam, shapes in (("batched", batched), ("batched-b", batched_b)):
        for b, m, n, k in shapes:
            for p in (["bf16", "fp32-tf32"] if gpu else precs):
                cases.append((fam, p, GemmOp(m, n, k, batch=b, **GEMM_PRECISIONS.get(p, {}))))
    return cases


def conv_cases(gpu: bool = True) -> list[tuple[str, str, Conv2dOp]]:
    """(family, precision label, op) of every conv case (batch 1 and 32 on GPUs; 1 and 8 on CPUs)."""
    cases = []
    batches = (1, 32) if gpu else (1, 8)
    for fam, _label, c, hw, k, r, st, pad in CONVS:
        for n in batches:
            if gpu:
                for p, dt in (("fp16", "float16"), ("bf16", "bfloat16")):
                    if c % 8 == 0 and (p == "fp16" or n == 32):
                        cases.append((fam, p, Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=pad, layout="nhwc",
                                                       dtype=dt)))
                cases.append((fam, "fp32-tf32", Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=pad, layout="nchw",
                                                         dtype="float32", fp32_precision="high")))
            else:
                if n * c * hw * hw * k * r * r > 6e9:
                    continue
                cases.append((fam, "fp32", Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=pad, layout="nchw",
                                                    dtype="float32")))
    return cases


def split_of(family: str) -> str:
    """``"heldout"`` for held-out families, else ``"fit"``."""
    return "heldout" if family in HELD_OUT else "fit"
