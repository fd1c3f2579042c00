"""Models nobody tuned for, through the user path: timm CNNs / ViTs and Hugging Face transformers (random
weights, built offline from configs) patched with ``tracea_torch.patched(model, attention=True)`` (conv2d,
linear and SDPA, or without SDPA: ``--no-attention``; default settings, arbiter on, untuned) against the
same model eager, interleaved in one run. Per model and configuration it prints the first patched call's
time (plans, compilation and the arbiter's timing), the output's error against eager, eager and CUDA-graph
ratios (eager time / patched time: > 1 means Tracea is faster), and the fallbacks (the three most counted
reasons under each row) and the arbiter's verdicts on the model's attention signatures (which side serves
SDPA, with both device times) and the model check's verdict (patched vs unpatched); a failure is printed and the run goes on (any failure is a bug).
The patched model's calls until the model check decides (``judged_calls`` in the JSON, a dozen or so) run
before the timed rounds, as a model's first calls before its steady state.

    source scripts/srcenv.sh
    python benchmarks/user_path/bench_zoo.py --device cuda [--timm a,b] [--hf bert,llama] [--no-graphs]
        [--no-fold] [--fuse sequential|traced|off] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracea_torch  # noqa: E402
from bench_user_path import graphed, paired  # noqa: E402
from tracea_torch import arbiter, fallbacks, model_check  # noqa: E402

TIMM_DEFAULT = "efficientnet_b0,mobilenetv3_large_100,regnety_016,resnext50_32x4d,densenet121,vit_small_patch16_224"
HF_DEFAULT = "bert,llama"


#: the CUDA configurations of the timm cases (``--gpu-configs``)
GPU_CONFIGS = "float16-cl-32,float16-cl-1,float32-nchw-8"


def timm_cases(names: str, device: torch.device, cpu_dtypes: str = "float32",
               gpu_configs: str = GPU_CONFIGS) -> Iterator[tuple[str, nn.Module, Callable[[], Any]]]:
    """(name, model, make_input) for each timm model: on CUDA each of ``gpu_configs`` (``dtype-layout-batch``,
    e.g. ``float16-cl-32``; default fp16 channels-last at batch 32 and 1, fp32 NCHW at batch 8); batch 2 on the
    CPU in each of ``cpu_dtypes`` (NCHW)."""
    try:
        import timm
    except ImportError:
        print("  (timm is not installed)")
        return
    cuda = device.type == "cuda"
    configs = ([(getattr(torch, d), lay == "cl", int(b)) for d, lay, b in (c.split("-") for c in gpu_configs.split(","))]
               if cuda else [(getattr(torch, d), False, 2) for d in cpu_dtypes.split(",")])
    for name in filter(None, names.split(",")):
        try:
            base = timm.create_model(name, pretrained=False).eval()
        except Exception as exc:  # noqa: BLE001
            print(f"  (timm {name} unavailable: {exc})")
            continue
        size = base.default_cfg.get("input_size", (3, 224, 224))[-1]
        for dtype, cl, batch in configs:
            fmt = torch.channels_last if cl else torch.contiguous_format
            model = copy.deepcopy(base).to(device=device, dtype=dtype, memory_format=fmt)
            x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=fmt)
            yield f"timm {name} b{batch} {str(dtype)[6:]}{' CL' if cl else ''}", model, (lambda x=x: (x,))


def _hf_build(transformers: Any, name: str, scale: int) -> tuple[Any, nn.Module, list[tuple[int, int]]]:
    """(config, model, [(batch, tokens)]) of one small Hugging Face model; ``vit`` takes images of
    224² (``tokens`` 197). Raises for an unknown name or a transformers version without the model."""
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=768 // scale, num_hidden_layers=4,
                                      num_attention_heads=12 // scale, intermediate_size=3072 // scale,
                                      attn_implementation="sdpa")
        return cfg, transformers.BertModel(cfg), [(8, 256 // scale)]
    if name in ("llama", "llama_pad"):  # llama_pad: a left-padded batch with its attention_mask (HF's 4-D mask)
        cfg = transformers.LlamaConfig(hidden_size=2048 // scale, intermediate_size=5632 // scale,
                                       num_hidden_layers=4, num_attention_heads=16 // scale,
                                       num_key_value_heads=4 // scale, vocab_size=32000 // scale,
                                       attn_implementation="sdpa")
        shapes = [(4, 1024 // scale)] if name == "llama_pad" else [(1, 1024 // scale), (4, 1)]
        return cfg, transformers.LlamaForCausalLM(cfg), shapes
    if name == "qwen2":  # GQA with biased q/k/v projections
        cfg = transformers.Qwen2Config(hidden_size=1536 // scale, intermediate_size=8960 // scale,
                                       num_hidden_layers=4, num_attention_heads=12 // scale,
                                       num_key_value_heads=2 if scale == 1 else 1, vocab_size=32000 // scale,
                                       attn_implementation="sdpa")
        return cfg, transformers.Qwen2ForCausalLM(cfg), [(2, 512 // scale), (8, 1)]
    if name == "mistral":  # sliding-window attention: a banded mask once the sequence outgrows the window
        cfg = transformers.MistralConfig(hidden_size=1024 // scale, intermediate_size=3584 // scale,
                                         num_hidden_layers=4, num_attention_heads=16 // scale,
                                         num_key_value_heads=8 // scale, sliding_window=256 // scale,
                                         vocab_size=32000 // scale, attn_implementation="sdpa")
        return cfg, transformers.MistralForCausalLM(cfg), [(1, 768 // scale), (2, 1)]
    if name == "gpt2":  # Conv1D projections (not nn.Linear): SDPA and the LM head only
        cfg = transformers.GPT2Config(n_embd=768 // scale, n_layer=4, n_head=12 // scale,
                                      vocab_size=32000 // scale, attn_implementation="sdpa")
        return cfg, transformers.GPT2LMHeadModel(cfg), [(4, 256 // scale)]
    if name == "vit":  # the Hugging Face ViT: a patch-embedding conv, then SDPA encoder blocks
        cfg = transformers.ViTConfig(hidden_size=768 // scale, num_hidden_layers=4,
                                     num_attention_heads=12 // scale, intermediate_size=3072 // scale,
                                     attn_implementation="sdpa")
        return cfg, transformers.ViTModel(cfg, add_pooling_layer=False), [(16 // scale, 197), (1, 197)]
    raise ValueError(f"unknown hf model {name}: bert, llama, llama_pad, qwen2, mistral, gpt2, vit")


def hf_cases(names: str, device: torch.device, cpu_dtypes: str = "float32") -> Iterator[tuple[str, nn.Module,
                                                                                            Callable[[], Any]]]:
    """(name, model, make_input) for small Hugging Face models built from configs (SDPA attention):
    a BERT-style encoder at batch 8 x 256 tokens, a Llama-style decoder (GQA) at 1 x 1024 (prefill) and
    4 x 1 token (no KV cache), and, by name, a left-padded Llama batch of 4 x 1024 with its attention_mask
    (``llama_pad``: HF's 4-D boolean mask), Qwen2 (biased projections), Mistral (sliding window), GPT-2
    (Conv1D projections) and the HF ViT; smaller (a quarter of the width) on the CPU, in each of ``cpu_dtypes``."""
    try:
        import transformers
    except ImportError:
        print("  (transformers is not installed)")
        return
    cuda = device.type == "cuda"
    dtypes = [torch.bfloat16] if cuda else [getattr(torch, d) for d in cpu_dtypes.split(",")]
    scale = 1 if cuda else 4  # smaller models on the CPU
    for name in filter(None, names.split(",")):
        try:
            cfg, model, shapes = _hf_build(transformers, name, scale)
        except Exception as exc:  # noqa: BLE001 - an older transformers without the model
            print(f"  (hf {name} unavailable: {type(exc).__name__}: {str(exc)[:120]})")
            continue
        for dtype in dtypes:  # (a copy per dtype: the cases are all built before the first one runs)
            typed = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
            for batch, seq in shapes:
                if name == "vit":
                    px = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
                    yield f"hf vit {batch}x{seq} {str(dtype)[6:]}", typed, (lambda px=px: (px,))
                    continue
                ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
                if name.endswith("_pad"):  # sequence i left-padded by i * seq / (2 * batch) tokens
                    keep = torch.arange(seq, device=device)[None, :] >= torch.tensor(
                        [i * seq // (2 * batch) for i in range(batch)], device=device)[:, None]
                    yield (f"hf {name} {batch}x{seq} {str(dtype)[6:]}", typed,
                           (lambda ids=ids, keep=keep: (ids, keep.long())))
                    continue
                yield (f"hf {name} {batch}x{seq} {str(dtype)[6:]}", typed,
                       (lambda ids=ids: (ids,)))


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    return out[0]


def _fp64_errors(model: nn.Module, args: tuple, eager: torch.Tensor, patched: torch.Tensor) -> tuple[float, float]:
    """(eager's, the patched model's) relative error against the model run in float64 (NaN when that
    cannot run): a model whose own float32/16 output is far from float64 amplifies rounding (random
    BatchNorm statistics in deep CNNs do), and then eager and patched differ by as much."""
    try:
        m64 = copy.deepcopy(model).double()
        with torch.no_grad():
            ref = _logits(m64(*[a.double() if a.is_floating_point() else a for a in args])).double()
    except Exception:  # noqa: BLE001 - only a diagnostic
        return float("nan"), float("nan")
    fin = torch.isfinite(ref) & torch.isfinite(eager) & torch.isfinite(patched)
    r = ref[fin]
    return tuple(float((t.double()[fin] - r).norm() / max(r.norm(), 1e-30)) for t in (eager, patched))  # type: ignore[return-value]


def run_case(name: str, model: nn.Module, make: Callable[[], Any], device: torch.device, graphs: bool,
             attention: bool = True, patch_options: dict | None = None) -> dict:
    """Eager vs patched for one model and input; never raises (a failure is the row's ``error``)."""
    cuda = device.type == "cuda"
    args = make()
    row: dict[str, Any] = {"case": name}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    patched_model = copy.deepcopy(model)
    try:
        with torch.no_grad(), tracea_torch.patched(patched_model, attention=attention, **(patch_options or {})):
            fallbacks.reset()
            arbiter.reset()
            model_check.reset()
            ref = _logits(model(*args))
            sync()
            t0 = time.perf_counter()
            out = _logits(patched_model(*args))
            sync()
            row["first_call_s"] = time.perf_counter() - t0
            fin = torch.isfinite(ref)
            row["finite_match"] = bool(torch.equal(torch.isfinite(out), fin))
            row["nonfinite"] = int((~fin).sum())  # eager's own overflow (random weights in fp16)
            o, r = out.double()[fin], ref.double()[fin]  # error over eager's finite outputs
            row["rel_err"] = float((o - r).norm() / max(r.norm(), 1e-30))
            if row["rel_err"] > 1e-2:  # a random-weight model may amplify rounding: compare both with fp64
                row["fp64_err"] = _fp64_errors(model, args, ref, out)
            # the model check's judging calls (patched and unpatched, a dozen or so) come before the timing,
            # as a model's first calls come before its steady state: the ratio is what later calls get
            start, judged = time.perf_counter(), 1
            while not model_check.verdicts() and judged < 64 and time.perf_counter() - start < 5.0:
                patched_model(*args)
                judged += 1
            sync()
            row["judged_calls"] = judged
            calls = 10 if cuda else 3
            tp, te = paired(lambda: patched_model(*args), lambda: model(*args), calls, 7, device)
            row.update(patched_s=tp, eager_s=te, ratio=te / tp)
            counts = fallbacks.counts()
            row["fallbacks"] = sum(counts.values())
            row["fallback_reasons"] = [f"{kind} x{n}: {reason[:90]}" for (kind, reason), n in
                                       sorted(counts.items(), key=lambda kv: -kv[1])[:3]]
            row["model_verdicts"] = [f"{v.winner} ({v.signature}: patched {v.patched_s * 1e3:.2f} vs unpatched "
                                     f"{v.eager_s * 1e3:.2f} ms)" for v in model_check.verdicts()]
            row["attention_verdicts"] = [f"{v.winner} ({v.op}: {v.variant} {v.tracea_s * 1e6:.1f} vs PyTorch "
                                         f"{v.torch_s * 1e6:.1f} us device)"
                                         for v in arbiter.verdicts() if v.op.startswith("attention")]
            if cuda and graphs:
                try:
                    ge = graphed(lambda: model(*args))
                except Exception as exc:  # noqa: BLE001 - a model torch itself cannot capture is not ours
                    row["graph_error"] = f"eager model not capturable: {type(exc).__name__}: {str(exc)[:160]}"
                    ge = None
                if ge is not None:
                    try:
                        gp = graphed(lambda: patched_model(*args))
                        tp, te = paired(gp, ge, calls, 7, device)
                        row.update(graph_patched_s=tp, graph_eager_s=te, graph_ratio=te / tp)
                    except Exception as exc:  # noqa: BLE001 - the eager model captured: a Tracea bug
                        row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    except Exception as exc:  # noqa: BLE001 - report and go on
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timm", default=TIMM_DEFAULT, help="comma-separated timm model names ('' for none)")
    p.add_argument("--gpu-configs", default=GPU_CONFIGS,
                   help="CUDA timm cases as dtype-layout-batch (layout cl or nchw), e.g. float16-nchw-32 for a 16-bit model "
                        "not converted to channels_last")
    p.add_argument("--cpu-dtypes", default="float32", help="dtypes of the timm and Hugging Face cases on the CPU (e.g. float32,bfloat16)")
    p.add_argument("--hf", default=HF_DEFAULT, help="bert,llama,llama_pad,qwen2,mistral,gpt2,vit ('' for none)")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--only", default="", help="run only the cases whose name contains this substring")
    p.add_argument("--no-attention", action="store_true", help="patch conv2d and linear only")
    p.add_argument("--no-fold", action="store_true", help="keep BatchNorms apart (fold_batchnorm=False)")
    p.add_argument("--fuse", choices=("sequential", "traced", "off"), default="sequential",
                   help="activation fusion: inside nn.Sequential (default), also traced (opt-in), or off")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"machine: {where}, torch {torch.__version__}; ratio = eager time / patched time")
    rows = []
    for name, model, make in [*timm_cases(args.timm, device, args.cpu_dtypes, args.gpu_configs), *hf_cases(args.hf, device, args.cpu_dtypes)]:
        if args.only not in name:
            continue
        options = {"fold_batchnorm": not args.no_fold,
                   "fuse_activations": {"sequential": True, "traced": "traced", "off": False}[args.fuse]}
        row = run_case(name, model, make, device, not args.no_graphs, not args.no_attention, options)
        rows.append(row)
        if "error" in row:
            print(f"  {name:<44} FAILED {row['error']}", flush=True)
            continue
        graph = (f"graphs {row['graph_ratio']:.2f}x" if "graph_ratio" in row
                 else "graphs -" if "graph_error" not in row
                 else "graphs n/a" if row["graph_error"].startswith("eager") else "graphs FAILED")
        finite = ("" if not row["nonfinite"] else f" ({row['nonfinite']} non-finite in eager"
                  f"{', matched' if row['finite_match'] else ', NOT MATCHED'})")
        if "fp64_err" in row:
            finite += " (vs fp64: eager {:.1e}, patched {:.1e})".format(*row["fp64_err"])
        print(f"  {name:<44} first call {row['first_call_s']:6.2f} s  err {row['rel_err']:.1e}{finite}  eager "
              f"{row['ratio']:.2f}x  {graph}  fallbacks {row['fallbacks']}", flush=True)
        if row["nonfinite"] == 0 and not row["finite_match"]:
            print("      NON-FINITE OUTPUTS WHERE EAGER IS FINITE")
        if "graph_error" in row:
            print(f"      graph capture: {row['graph_error']}")
        for reason in row.get("fallback_reasons", []):
            print(f"      fallback {reason}")
        for verdict in row.get("attention_verdicts", []):
            print(f"      SDPA verdict: {verdict}")
        for verdict in row.get("model_verdicts", []):
            print(f"      model check: {verdict}")
    ok = [r for r in rows if "ratio" in r]
    if ok:
        ratios = sorted(r["ratio"] for r in ok)
        print(f"\n{len(ok)} cases: eager ratio median {ratios[len(ratios) // 2]:.2f}x, min {ratios[0]:.2f}x; "
              f"failures {len(rows) - len(ok)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": where, "rows": rows}, indent=1))
    return 1 if len(ok) < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
