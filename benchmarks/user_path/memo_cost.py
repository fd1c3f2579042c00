"""What the patched layers' per-call checks cost inside whole models (the user path), interleaved in one run.

For each model (``bench_user_path.py``'s ResNet-style / decoder cases and ``bench_zoo.py``'s Hugging Face
BERT / Llama configs), the forward is timed eager and patched four ways, round-robin:

* ``patched``: conv2d + linear + SDPA patched (``tracea_torch.patched(model, attention=True)``), defaults;
* ``layers``: conv2d + linear patched, SDPA not;
* ``layers direct``: the same, but each patched layer calls its memo's plan (or, for a signature PyTorch
  serves, ``F.conv2d`` / ``F.linear``) without the memo's checks -- what the layers would cost if checking
  the call signature, the plan generation and torch's modes were free.

The gap between ``layers`` and ``layers direct`` is the checks' share of the forward (cold caches inside
a model make them cost several times what a single layer timed alone shows).

    python benchmarks/user_path/memo_cost.py --device cuda [--models resnet,decoder] [--hf bert,llama] [--timm levit_128]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracea_torch  # noqa: E402
from bench_user_path import model_cases  # noqa: E402
from bench_zoo import hf_cases  # noqa: E402
from tracea_torch import modules  # noqa: E402

_KEY = "_tracea_memo"
_conv_layer, _linear_layer = modules.conv2d_layer, modules.linear_layer


def _direct_conv(m: Any, x: torch.Tensor, w: torch.Tensor, b: Any, act: Any) -> torch.Tensor:
    memo = m.__dict__.get(_KEY)
    if memo is None:
        return _conv_layer(m, x, w, b, act)
    if memo.lean:
        return F.conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups)
    return memo.plan(x, w, b)


def _direct_linear(m: Any, x: torch.Tensor, act: Any) -> torch.Tensor:
    memo = m.__dict__.get(_KEY)
    if memo is None:
        return _linear_layer(m, x, act)
    ps = m._parameters
    if memo.lean:
        return F.linear(x, ps["weight"], ps["bias"])
    return memo.plan(x, ps["weight"], ps["bias"])


def _checks(bypassed: bool) -> None:
    modules.conv2d_layer, modules.linear_layer = ((_direct_conv, _direct_linear) if bypassed
                                                  else (_conv_layer, _linear_layer))


def _wall_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(name: str, model: torch.nn.Module, args: tuple, device: torch.device, rounds: int) -> None:
    """Print one model's row: the medians over ``rounds`` rounds, the four ways in turn each round."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    calls = 10 if cuda else 3
    full, layers = copy.deepcopy(model), copy.deepcopy(model)
    tracea_torch.patch_conv2d(layers)
    tracea_torch.patch_linear(layers)
    ways: dict[str, list[float]] = {"eager": [], "patched": [], "layers": [], "layers direct": []}
    with torch.no_grad():
        for _ in range(3):  # verdicts, plans and memos in place
            model(*args)
            layers(*args)
            with tracea_torch.patched(full, attention=True):
                full(*args)
        try:
            for _ in range(rounds):
                for way, times in ways.items():
                    _checks(way == "layers direct")
                    if way == "patched":
                        with tracea_torch.patched(full, attention=True):
                            full(*args)
                            times.append(_wall_us(lambda: full(*args), calls, sync))
                        continue
                    fn = (lambda: model(*args)) if way == "eager" else (lambda: layers(*args))
                    fn()
                    times.append(_wall_us(fn, calls, sync))
        finally:
            _checks(False)
    eager = statistics.median(ways["eager"])
    print(f"  {name:<44} " + "  ".join(f"{way} {statistics.median(t):8.1f} us ({eager / statistics.median(t):.3f}x)"
                                       for way, t in ways.items()), flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="resnet,decoder", help="bench_user_path cases ('' for none)")
    p.add_argument("--hf", default="bert,llama", help="bench_zoo Hugging Face cases ('' for none)")
    p.add_argument("--timm", default="", help="timm model names (bench_user_path's timm cases)")
    p.add_argument("--timm-fp32-batch", type=int, default=8, help="batch of the timm float32 cases")
    p.add_argument("--only", default="", help="substring a case name must contain")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"machine: {where}, torch {torch.__version__}; ratio = eager time / this way's time")
    ns = argparse.Namespace(models=args.models, timm=args.timm, timm_fp32_batch=args.timm_fp32_batch)
    cases = [(n, m, (x,)) for n, m, x in model_cases(device, ns)] if args.models or args.timm else []
    cases += [(n, m, make()) for n, m, make in hf_cases(args.hf, device)]
    for name, model, call_args in cases:
        if args.only in name:
            measure(name, model, call_args, device, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
