"""16-bit NCHW convolutions (a float16 / bfloat16 model not converted to channels_last) on the user path:
``tracea.ops.conv2d`` (default decision) against ``F.conv2d`` on ResNet-50's layers at batch 1 and 32, eager
and with the calls captured in CUDA graphs; then timm models in NCHW patched with ``tracea_torch.patched``
against the same model eager (ratios: PyTorch time / Tracea time).

    source scripts/srcenv.sh
    python benchmarks/user_path/bench_nchw16.py [--models-only] [--models resnet50,convnext_tiny] [--odd-widths]

For the "before" figure, run it again with ``TRACEA_EXCLUDE_VARIANTS=cuda.conv2d.wgmma,cuda.conv2d.wgmma_nchw1x1``
(16-bit NCHW convs then go to cuDNN, as before the Hopper convs served them; excluding only
``cuda.conv2d.wgmma_nchw1x1`` sends the 1x1 stride-1 layers to cuDNN, as before 2026-11-27).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracea  # noqa: E402
import tracea_torch  # noqa: E402
from bench_user_path import graphed, paired  # noqa: E402

#: (in channels, size, out channels, kernel, stride): ResNet-50's 3x3, strided and 1x1 layers
LAYERS = [(64, 56, 64, 3, 1), (64, 56, 256, 1, 1), (256, 56, 64, 1, 1), (128, 28, 128, 3, 1), (128, 56, 128, 3, 2),
          (256, 14, 256, 3, 1), (512, 7, 512, 3, 1), (1024, 14, 256, 1, 1), (256, 14, 1024, 1, 1), (256, 28, 512, 1, 2),
          (2048, 7, 512, 1, 1), (512, 7, 2048, 1, 1)]
#: (same) odd widths of MobileNet / EfficientNet / DenseNet (channels in 16-byte runs but not multiples of 64)
ODD_LAYERS = [(40, 28, 40, 3, 1), (96, 28, 96, 3, 1), (160, 14, 160, 3, 1), (24, 56, 24, 3, 1), (672, 14, 112, 1, 1),
              (160, 7, 960, 1, 1), (16, 112, 96, 1, 1), (144, 56, 24, 1, 1), (96, 14, 576, 1, 1), (960, 7, 160, 1, 1)]


def layers(dev: torch.device, odd: bool = False) -> None:
    ratios = []
    for dt in (torch.float16, torch.bfloat16):
        for bsz in (1, 32):
            for c, hw, k, r, st in LAYERS + (ODD_LAYERS if odd else []):
                x = torch.randn(bsz, c, hw, hw, device=dev, dtype=dt)
                w = torch.randn(k, c, r, r, device=dev, dtype=dt) / (c * r * r) ** 0.5
                b = torch.randn(k, device=dev, dtype=dt)
                pad = r // 2

                def ours(x=x, w=w, b=b, st=st, pad=pad):  # noqa: ANN001, ANN202
                    return tracea.ops.conv2d(x, w, b, stride=st, padding=pad)

                def theirs(x=x, w=w, b=b, st=st, pad=pad):  # noqa: ANN001, ANN202
                    return F.conv2d(x, w, b, stride=st, padding=pad)

                ref = F.conv2d(x.float(), w.float(), b.float(), stride=st, padding=pad)
                err = float((ours().float() - ref).norm() / ref.norm())
                ta, tb = paired(ours, theirs, 20, 7, dev)
                ga, gb = paired(graphed(ours), graphed(theirs), 20, 7, dev)
                ratios.append((tb / ta, gb / ga))
                print(f"  {str(dt)[6:]} b{bsz} {c}->{k}@{hw} {r}x{r}/s{st}: tracea {ta * 1e6:7.1f} us  cudnn "
                      f"{tb * 1e6:7.1f} us  eager {tb / ta:.2f}x  graphs {gb / ga:.2f}x  err {err:.1e}", flush=True)
    eager, graph = [r[0] for r in ratios], [r[1] for r in ratios]
    print(f"layers: eager median {statistics.median(eager):.2f}x min {min(eager):.2f}x; graphs median "
          f"{statistics.median(graph):.2f}x min {min(graph):.2f}x", flush=True)


def models(names: str, dev: torch.device) -> None:
    import timm

    for name in filter(None, names.split(",")):
        for dt, bsz in ((torch.float16, 32), (torch.float16, 1), (torch.bfloat16, 8)):
            m = timm.create_model(name, pretrained=False).to(dev, dt).eval()
            x = torch.randn(bsz, 3, 224, 224, device=dev, dtype=dt)
            pm = copy.deepcopy(m)
            with torch.no_grad(), tracea_torch.patched(pm):
                ref, out = m(x).float(), pm(x).float()
                err = float((out - ref).norm() / ref.norm())
                ta, tb = paired(lambda: pm(x), lambda: m(x), 5, 7, dev)  # noqa: B023
                ga, gb = paired(graphed(lambda: pm(x)), graphed(lambda: m(x)), 5, 7, dev)  # noqa: B023
            print(f"  {name} {str(dt)[6:]} NCHW b{bsz}: eager {tb / ta:.2f}x  graphs {gb / ga:.2f}x  err {err:.1e}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-only", action="store_true")
    ap.add_argument("--odd-widths", action="store_true", help="also the odd-width layers (ODD_LAYERS)")
    ap.add_argument("--models", default="resnet50,convnext_tiny,regnety_016,densenet121")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    if not args.models_only:
        layers(dev, args.odd_widths)
    models(args.models, dev)


if __name__ == "__main__":
    main()
