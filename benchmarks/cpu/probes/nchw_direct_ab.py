"""The fp32 NCHW conv2d user path with the direct algorithm against the indirect one, in one process:
``tracea.ops.conv2d`` with the default (untuned) config, the same call with that config's algorithm set
to 1 (indirect: the input's NHWC copy and transposed stores) and to 3 (direct NCHW), and
``F.conv2d``, interleaved (order reversed every other round), ResNet 3x3 layers, padding 1. Prints, per
layer, the median over ``--reps`` repetitions of each one's ratio to torch (torch time / ours; each
repetition's ratio from the medians of ``--rounds`` rounds) and the range over the repetitions.

    source scripts/srcenv.sh
    python benchmarks/cpu/probes/nchw_direct_ab.py [--layers 64@56,128@28] [--batches 8,1] [--rounds 15] [--reps 5]

Like ``bench_user_cpu.py``: a fresh empty tuning cache, NumPy inputs for Tracea, torch tensors sharing
their memory for torch, and torch imported after Tracea.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np

import tracea
from tracea.doctor import get_doctor
from tracea.tuning.cache import TuningCache, set_cache


def _calls(x: np.ndarray, w: np.ndarray, cfg: Any, anchor: Callable[[], Any]) -> dict[str, Callable[[], Any]]:
    """The timed callables of one layer: the default call, the indirect and direct algorithms, torch."""
    return {"default": lambda: tracea.ops.conv2d(x, w, padding=1),
            "indirect": lambda: tracea.ops.conv2d(x, w, padding=1, config=cfg.with_params(indirect=1)),
            "direct": lambda: tracea.ops.conv2d(x, w, padding=1, config=cfg.with_params(indirect=3)),
            "torch": anchor}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="64@56,128@28,256@14,512@7")
    ap.add_argument("--batches", default="8,1")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=5)
    ns = ap.parse_args()
    set_cache(TuningCache(os.path.join(tempfile.mkdtemp(), "empty_cache.json")))
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    for batch in (int(b) for b in ns.batches.split(",")):
        for c, hw in (tuple(int(v) for v in lay.split("@")) for lay in ns.layers.split(",")):
            x = rng.standard_normal((batch, c, hw, hw), dtype=np.float32)
            w = (rng.standard_normal((c, c, 3, 3), dtype=np.float32) / np.sqrt(9 * c)).astype(np.float32)
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            op = tracea.Conv2dOp(batch, c, hw, hw, c, 3, 3, padding=1)
            cfg = get_doctor().decide(op, "cpu").config
            fns = _calls(x, w, cfg, lambda xt=xt, wt=wt: F.conv2d(xt, wt, padding=1))
            ref = F.conv2d(xt.double(), wt.double(), padding=1).numpy()
            for name in ("default", "indirect", "direct"):
                out = fns[name]()
                assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5, name
            ratios: dict[str, list[float]] = {k: [] for k in ("default", "indirect", "direct")}
            tgf = []
            with torch.no_grad():
                for fn in fns.values():
                    fn(), fn()
                for _ in range(ns.reps):
                    ts: dict[str, list[float]] = {k: [] for k in fns}
                    names = list(fns)
                    for r in range(ns.rounds):
                        for k in names if r % 2 == 0 else names[::-1]:
                            t = time.perf_counter()
                            fns[k]()
                            ts[k].append(time.perf_counter() - t)
                    med = {k: statistics.median(v) for k, v in ts.items()}
                    for k in ratios:
                        ratios[k].append(med["torch"] / med[k])
                    tgf.append(op.flops / med["torch"] / 1e9)
            print(f"{c}@{hw} b{batch} (default algorithm {cfg.get('indirect')}): "
                  + "  ".join(f"{k} {statistics.median(v):.3f}x ({min(v):.2f}-{max(v):.2f})" for k, v in ratios.items())
                  + f"  torch {statistics.median(tgf):.0f} GFLOP/s  load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
