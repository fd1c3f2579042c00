"""Where a patched model gains or loses against eager PyTorch, layer by layer (the user path).

For each model case of ``bench_user_path.py`` (same builders), every conv2d / linear layer is timed on the
input it sees in the model: the patched layer (``tracea_torch.patch_conv2d`` / ``patch_linear``, default
settings, the arbiter's verdict included) against the same layer unpatched, interleaved, back to back
between CUDA events (nothing queued ahead: what an eager forward sees) and as host time. The table names
what serves each layer (a Tracea variant, or PyTorch and why) and sums the per-layer differences next to
the whole-model difference, so a model-level miss can be traced to layers (kernel or host time) and to
what is left outside them.

    python benchmarks/user_path/layer_breakdown.py --device cuda [--models resnet,decoder] [--timm resnet50]

``--graphs`` (CUDA) adds each layer and the whole model captured in CUDA graphs, patched vs unpatched
(device time only: where a ``[CUDA graphs]`` model row of ``bench_user_path.py`` loses).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracea_torch  # noqa: E402
from bench_user_path import graphed, model_cases, paired  # noqa: E402
from tracea_torch import recording  # noqa: E402
from tracea_torch.choice import choose  # noqa: E402


def layer_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The first input each conv2d / linear layer of ``model`` receives in one forward."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name, m in model.named_modules():
        if type(m) in (nn.Conv2d, nn.Linear):
            hooks.append(m.register_forward_pre_hook(
                lambda mod, args, name=name: seen.setdefault(name, args[0].detach().clone(
                    memory_format=torch.preserve_format))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def served_by(layer: nn.Module, xin: torch.Tensor) -> str:
    """``tracea:<variant>`` or ``torch: <reason>`` for the patched ``layer`` on ``xin``."""
    with recording.recording() as calls, torch.no_grad():
        layer(xin)
    if not calls:
        return "?"
    call = calls[-1]
    if call.fallback is not None:
        return "torch: " + call.fallback.replace("arbiter: ", "")[:70]
    try:
        return "tracea: " + choose(call.op, xin.device).chosen.variant.name
    except Exception as exc:  # noqa: BLE001 - only a label
        return f"tracea: ? ({type(exc).__name__})"


def breakdown(name: str, model: nn.Module, x: torch.Tensor, device: torch.device, graphs: bool = False) -> dict[str, Any]:
    patched = copy.deepcopy(model)
    tracea_torch.patch_conv2d(patched)
    tracea_torch.patch_linear(patched)
    inputs = layer_inputs(model, x)
    calls = 10 if device.type == "cuda" else 3
    with torch.no_grad():
        patched(x)  # first calls: plans and the arbiter's verdicts
        tm, te = paired(lambda: patched(x), lambda: model(x), calls, 7, device)
        if graphs:
            gm, ge = paired(graphed(lambda: patched(x)), graphed(lambda: model(x)), calls, 7, device)
    print(f"\n{name}: model patched {tm * 1e6:.1f} us, eager {te * 1e6:.1f} us, ratio {te / tm:.2f}x "
          f"(difference {(tm - te) * 1e6:+.1f} us)")
    if graphs:
        print(f"  in CUDA graphs: patched {gm * 1e6:.1f} us, eager {ge * 1e6:.1f} us, ratio {ge / gm:.2f}x")
    print(f"  {'layer':<22} {'served by':<58} {'patched':>9} {'eager':>9} {'diff':>8} {'host p/e':>13}"
          + (f" {'graph p/e':>15}" if graphs else ""))
    ours, theirs = dict(patched.named_modules()), dict(model.named_modules())
    rows = []
    with torch.no_grad():
        for lname, xin in inputs.items():
            pl, rl = ours[lname], theirs[lname]
            who = served_by(pl, xin)
            fp, fr = (lambda pl=pl, xin=xin: pl(xin)), (lambda rl=rl, xin=xin: rl(xin))
            tp, tr = paired(fp, fr, 40, 7, device)
            hp, hr = paired(fp, fr, 40, 5, device, host=True)
            rows.append({"layer": lname, "served_by": who, "patched_s": tp, "eager_s": tr, "host_patched_s": hp,
                         "host_eager_s": hr})
            extra = ""
            if graphs:
                gp, gr = paired(graphed(fp), graphed(fr), 40, 7, device)
                rows[-1].update(graph_patched_s=gp, graph_eager_s=gr)
                extra = f" {gp * 1e6:7.1f}/{gr * 1e6:6.1f}u"
            print(f"  {lname:<22} {who:<58} {tp * 1e6:8.1f}u {tr * 1e6:8.1f}u {(tp - tr) * 1e6:+7.1f}u "
                  f"{hp * 1e6:6.1f}/{hr * 1e6:5.1f}u{extra}", flush=True)
    by_kind: dict[str, float] = {}
    for r in rows:
        kind = r["served_by"].split(":")[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + r["patched_s"] - r["eager_s"]
    summed = sum(by_kind.values())
    print(f"  sum of layer differences {summed * 1e6:+.1f} us ("
          + ", ".join(f"{k} layers {v * 1e6:+.1f} us" for k, v in by_kind.items())
          + f"); outside the layers {(tm - te - summed) * 1e6:+.1f} us")
    if graphs:
        summed_g = sum(r["graph_patched_s"] - r["graph_eager_s"] for r in rows)
        print(f"  in CUDA graphs: sum of layer differences {summed_g * 1e6:+.1f} us; outside the layers "
              f"{(gm - ge - summed_g) * 1e6:+.1f} us")
    return {"case": name, "model_patched_s": tm, "model_eager_s": te, "layers": rows,
            **({"graph_patched_s": gm, "graph_eager_s": ge} if graphs else {})}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="resnet,decoder")
    p.add_argument("--timm", default="")
    p.add_argument("--only", default="", help="substring a case name must contain")
    p.add_argument("--timm-fp32-batch", type=int, default=32, help="batch of the timm float32 cases (bench_zoo: 8)")
    p.add_argument("--graphs", action="store_true", help="also time layers and models in CUDA graphs")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    if device.type == "cuda":
        print(f"machine: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    graphs = args.graphs and device.type == "cuda"
    results = [breakdown(name, model, x, device, graphs) for name, model, x in model_cases(device, args)
               if args.only in name]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
