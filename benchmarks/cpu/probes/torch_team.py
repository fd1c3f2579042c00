"""Patched linear layers between torch ops, for several torch thread counts: the user path (``patch_linear``,
default settings unless ``--no-arbiter``) against the same model eager, interleaved, and how many threads
the process started while doing it.

libgomp ends the surplus threads of its pool when a parallel region asks for fewer threads than the one
before and starts new ones for the next larger region; torch shares the runtime. A Tracea kernel whose team
size differs from torch's therefore made every switch between the two start and end threads (see
docs/backends/cpu.md, "One OpenMP team size"). The model: ``--blocks`` pre-norm MLP blocks (LayerNorm,
Linear d -> 4d, GELU, Linear 4d -> d, residual), as in a ViT, on ``--tokens`` rows.

    source scripts/srcenv.sh && python benchmarks/cpu/probes/torch_team.py [--dtype bfloat16] [--threads 0,8]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", default="0,half", help="torch thread counts (0: torch's default; half: half of it)")
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--tokens", type=int, default=394)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--no-arbiter", action="store_true", help="TRACEA_ARBITER=0: Tracea serves every linear")
    args = p.parse_args()
    if args.no_arbiter:
        os.environ["TRACEA_ARBITER"] = "0"
    import tracea_torch

    dt = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.dim) for _ in range(args.blocks)]).to(dt).eval()
    patched = copy.deepcopy(model)
    tracea_torch.patch_linear(patched)
    x = torch.randn(args.tokens, args.dim).to(dt)
    default = torch.get_num_threads()
    print(f"torch {torch.__version__}, default threads {default}, {os.cpu_count()} CPUs; {args.blocks} MLP blocks "
          f"{args.tokens} x {args.dim} {args.dtype}; ratio = eager time / patched time")

    def b2b(f: object, n: int = 5) -> float:
        t = time.perf_counter()
        for _ in range(n):
            f()  # type: ignore[operator]
        return (time.perf_counter() - t) / n

    with torch.no_grad():
        for spec in args.threads.split(","):
            n = default if spec in ("0", "") else max(1, default // 2) if spec == "half" else int(spec)
            torch.set_num_threads(n)
            for _ in range(3):
                patched(x)
                model(x)
            before, seen = _threads(), set()
            tp, te = [], []
            for r in range(args.rounds):
                for f, acc in ((lambda: patched(x), tp), (lambda: model(x), te))[:: 1 if r % 2 == 0 else -1]:
                    acc.append(b2b(f))
                    seen |= _threads()
            p_ms, e_ms = statistics.median(tp) * 1e3, statistics.median(te) * 1e3
            print(f"torch threads {n:3d}: patched {p_ms:7.2f} ms  eager {e_ms:7.2f} ms  ratio {e_ms / p_ms:5.2f}x  "
                  f"threads started while timing: {len(seen - before)}")
    torch.set_num_threads(default)


if __name__ == "__main__":
    main()
