"""A/B of the emitted CPU kernels of two source checkouts in one process, interleaved: the same GEMM /
conv2d / attention call through the library rendered by a base checkout (A), that base library built a
second time (A', the noise floor: same code, another .so) and the current checkout's (B). Each round
runs A A' B (reversed every other round); medians of the rounds are printed with B/A and A'/A, so a
difference is only believed where it clearly exceeds A'/A.

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/ab_checkouts.py --base /path/to/other/checkout \\
        [--only gemm,conv,attention] [--threads 1] [--rounds 61] [--isa avx512] [--gemm-sizes 1024,2048]
        [--conv-layers 64@56:8:nchw,128@28:1:nhwc]

The kernels are called through their C entry points (``tr_gemm``, ``tr_conv2d``, ``tr_attention``), whose
signatures must agree between the checkouts; the hero config of this checkout is used for both.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from tracea.doctor.host_plugin import host_profile
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea_cpu import kernels
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.toolchain import build
from tracea_cpu.variants import CpuAttentionVariant, CpuConv2dVariant, CpuGemmVariant

PROFILE = host_profile()
# Renders the requested sources with whatever checkout is first on PYTHONPATH.
_RENDER = r"""
import json, sys
from tracea.ir.epilogue import Epilogue
from tracea_cpu.emit.attention import attention_source
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
out = {}
for kind, isa, a, b, epi in json.loads(sys.argv[1]):
    isa_ = ISA_BY_NAME[isa]
    out[json.dumps([kind, isa, a, b, epi])] = (blocked_source(isa_, a, b, Epilogue.parse(epi)) if kind == "blocked"
                                               else attention_source(isa_, a, b))
json.dump(out, open(sys.argv[2], "w"))
"""


def render(root: str, wanted: list[list]) -> dict[str, str]:
    """Sources of ``wanted`` ([kind, isa, mr|bq, nr|bk, epilogue]) rendered by the checkout at ``root``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.join(root, "packages", p, "src")
                                        for p in sorted(os.listdir(os.path.join(root, "packages"))))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "src.json")
        subprocess.run([sys.executable, "-c", _RENDER, json.dumps(wanted), path], env=env, check=True)
        with open(path) as f:
            return json.load(f)


def problems(isa: str, only: set[str], nth: int, gemm_sizes: tuple[int, ...] = (1024,),
             conv_layers: str = "128@28:1:nhwc,128@28:1:nchw,512@7:1:nhwc,512@7:1:nchw") -> list[tuple[str, list, Callable[[Any], Callable[[], Any]], float]]:
    """(label, source key, library -> zero-argument call, FLOPs) per problem."""
    rng = np.random.default_rng(0)
    P = lambda a: a.ctypes.data  # noqa: E731
    out = []
    for s in gemm_sizes if "gemm" in only else []:
        op = GemmOp(s, s, s, epilogue="relu")
        cfg = CpuGemmVariant(ISA_BY_NAME[isa]).hero_configs(op, PROFILE)[0]
        a, b, c = (rng.standard_normal((s, s), dtype=np.float32) for _ in range(3))

        def gemm(lib, cfg=cfg, a=a, b=b, c=c, s=s):
            return lambda: lib.tr_gemm(1, s, s, s, P(a), s, 1, s * s, P(b), s, 1, s * s, P(c), s,
                                       s * s, None, cfg.get("mc"), cfg.get("nc"), cfg.get("kc"), nth)
        out.append((f"gemm {s}^3 relu", ["blocked", isa, cfg.get("mr"), cfg.get("nr"), "relu"], gemm, op.flops))
    if "conv" in only:
        for layer in conv_layers.split(","):
            shape, nb, lay = layer.split(":")
            ch, hw = (int(v) for v in shape.split("@"))
            op = Conv2dOp(int(nb), ch, hw, hw, ch, 3, 3, padding=1, layout=lay, epilogue="bias+relu")
            cfg = CpuConv2dVariant(ISA_BY_NAME[isa]).hero_configs(op, PROFILE)[0]
            x = rng.standard_normal(op.x_shape, dtype=np.float32)
            w = rng.standard_normal(op.w_shape, dtype=np.float32) * 0.05
            bias, y = rng.standard_normal(ch, dtype=np.float32), np.empty(op.out_shape, np.float32)

            def conv(lib, op=op, cfg=cfg, x=x, w=w, bias=bias, y=y):
                return lambda: lib.tr_conv2d(0 if op.layout.value == "nchw" else 1, op.n, op.c, op.h, op.w, op.k, 3, 3,
                                             1, 1, 1, 1, 1, 1, 1, op.p, op.q, P(x), P(w), P(bias), P(y), cfg.get("mc"),
                                             cfg.get("nc"), cfg.get("kc"), nth, int(cfg.get("indirect", 0) or 0))
            out.append((f"conv {ch}@{hw}^2 b{nb} {lay} {cfg.get('mr')}x{cfg.get('nr')} indirect={cfg.get('indirect')} "
                        f"bias+relu", ["blocked", isa, cfg.get("mr"), cfg.get("nr"), "bias+relu"], conv, op.flops))
    if "attention" in only:
        for causal in (False, True):
            op = AttentionOp(1, 8, 512, 512, 64, causal=causal)
            cfg = CpuAttentionVariant(ISA_BY_NAME[isa]).hero_configs(op, PROFILE)[0]
            q, k, v = (rng.standard_normal((1, 8, 512, 64), dtype=np.float32) for _ in range(3))
            o = np.empty_like(q)

            def attn(lib, causal=causal, q=q, k=k, v=v, o=o):
                return lambda: lib.tr_attention(1, 8, 8, 512, 512, 64, 0.125, int(causal), P(q), P(k), P(v), P(o), nth)
            out.append((f"attention 8x512x64 {'causal' if causal else 'full'}",
                        ["attention", isa, cfg.get("bq"), cfg.get("bk"), ""], attn, op.flops))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="root of the checkout to compare against (A)")
    ap.add_argument("--only", default="gemm,conv,attention")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--isa", default="avx512")
    ap.add_argument("--gemm-sizes", default="1024", help="square GEMM sizes (comma-separated)")
    ap.add_argument("--conv-layers", default="128@28:1:nhwc,128@28:1:nchw,512@7:1:nhwc,512@7:1:nchw",
                    help="3x3 conv layers channels@size:batch:layout (comma-separated)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cases = problems(args.isa, set(args.only.split(",")), args.threads,
                     tuple(int(v) for v in args.gemm_sizes.split(",")), args.conv_layers)
    wanted = [key for _, key, _, _ in cases]
    sources = {"A": render(args.base, wanted), "B": render(here, wanted)}
    flags = ISA_BY_NAME[args.isa].cflags
    for label, key, make, flops in cases:
        k = json.dumps(key)
        calls = {}
        for tag, src in (("A", sources["A"][k]), ("A'", sources["A"][k] + "\n/* A' */\n"), ("B", sources["B"][k])):
            lib = build(src, flags, f"ab-{tag}-{key[0]}")
            if key[0] == "blocked":
                lib.tr_gemm.argtypes, lib.tr_conv2d.argtypes = kernels.GEMM_ARGTYPES, kernels.CONV_ARGTYPES
                lib.tr_gemm.restype = lib.tr_conv2d.restype = ctypes.c_int
            else:
                lib.tr_attention.argtypes, lib.tr_attention.restype = kernels.ATTN_ARGTYPES, ctypes.c_int
            calls[tag] = make(lib)
        for fn in calls.values():
            fn(), fn()
        times: dict[str, list[float]] = {t: [] for t in calls}
        order = list(calls)
        for r in range(args.rounds):
            for tag in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                calls[tag]()
                times[tag].append(time.perf_counter() - t0)
        med = {t: float(np.median(v)) for t, v in times.items()}
        print(f"{label:46s} " + " | ".join(f"{t} {m * 1e3:7.3f} ms {flops / m / 1e9:6.1f} GF/s" for t, m in med.items())
              + f" | A'/A {med[chr(65) + chr(39)] / med['A']:.3f}  B/A {med['B'] / med['A']:.3f}", flush=True)


if __name__ == "__main__":
    main()
