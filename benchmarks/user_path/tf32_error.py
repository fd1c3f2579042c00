"""Accuracy of a patched fp32 model against float64, TF32 allowed and not, as a user's model sees it: the
whole network (eager PyTorch, patched with defaults, patched without BatchNorm folding, convs only) and each
patched conv against float64 on its own input, beside cuDNN's error on the same input (GPU).

    python benchmarks/user_path/tf32_error.py [--model inception_v3] [--batch 8]

Random weights (timm, ``pretrained=False``); a network's random BatchNorm statistics amplify layer errors.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
import torch.nn.functional as F

import tracea_torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    import timm

    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).eval().cuda()
    size = base.default_cfg.get("input_size", (3, 224, 224))[-1]
    x = torch.randn(args.batch, 3, size, size, device="cuda")
    with torch.no_grad():
        ref = copy.deepcopy(base).double()(x.double())
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            res = {"eager": rel(base(x), ref)}
            for name, kw in (("patched", {}), ("no fold", {"fold_batchnorm": False}),
                             ("convs only", {"linear": False, "fold_batchnorm": False})):
                pm = copy.deepcopy(base)
                with tracea_torch.patched(pm, **kw):
                    pm(x)
                    res[name] = rel(pm(x), ref)
            print(f"TF32 {'on ' if tf32 else 'off'}: " + "  ".join(f"{k} {v:.2e}" for k, v in res.items()), flush=True)
        torch.backends.cudnn.allow_tf32 = True
        pm = copy.deepcopy(base)
        rows = []

        def hook(mod: torch.nn.Conv2d, inputs: tuple, out: torch.Tensor, name: str) -> None:
            xi = inputs[0]
            hyper = (mod.stride, mod.padding, mod.dilation, mod.groups)
            r = F.conv2d(xi.double(), mod.weight.double(), None if mod.bias is None else mod.bias.double(), *hyper)
            rows.append((name, rel(out, r), rel(F.conv2d(xi, mod.weight, mod.bias, *hyper), r), tuple(mod.weight.shape)))

        with tracea_torch.patched(pm, linear=False, fold_batchnorm=False):
            pm(x)
            hs = [m.register_forward_hook(lambda mod, a, o, n=n: hook(mod, a, o, n))
                  for n, m in pm.named_modules() if isinstance(m, torch.nn.Conv2d)]
            pm(x)
            for h in hs:
                h.remove()
    rows.sort(key=lambda r: -r[1])
    print("worst convs (TF32 on): Tracea's error vs float64, cuDNN's")
    for name, ours, cudnn, w in rows[:8]:
        print(f"  {name:<32} {ours:.2e}  {cudnn:.2e}  w{w}")
    print(f"median over {len(rows)} convs: Tracea {statistics.median(r[1] for r in rows):.2e}, "
          f"cuDNN {statistics.median(r[2] for r in rows):.2e}")


if __name__ == "__main__":
    main()
