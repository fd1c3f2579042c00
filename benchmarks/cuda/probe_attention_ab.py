"""A/B probe of the CUDA attention kernels: this checkout's emitters against a baseline copy of
``tracea_cuda/emit`` (another checkout's, e.g. main's), the same configs on the same inputs, timed
interleaved with ``F.scaled_dot_product_attention`` in one process, so clock drift hits every side alike.

Per shape it prints SDPA's TFLOP/s and, for each config, the new and the baseline kernel's TFLOP/s (kernel:
calls queued behind a sleep kernel, device time only) with their ratio to SDPA, then the *user path*
(``tracea.ops.attention`` with default settings, untuned, back to back, host time counted) against SDPA's;
with a mask also the time of one conversion of it into the kernels' packed operand.
Every output is checked against SDPA's (relative error).

    python benchmarks/cuda/probe_attention_ab.py --baseline /path/to/other/packages/tracea-cuda/src/tracea_cuda/emit \
        [--parts prefill,gqa,masked] [--dtypes bfloat16,float16] [--heroes N] [--json out.json]

A config with params the baseline lacks (``tail``, ``edge_pv``) runs there without them, so such a row
compares the new option with the baseline's plain config; a baseline kernel from before the tail split's
kernel parameters gets the old parameter block.

Parts: ``prefill`` (``cuda.attention.wgmma``, B4 H16 S4096, D64 / D128, causal and not), ``gqa`` (B4 H32/8
S4096 D128), ``masked`` (``cuda.attention.flash_mma`` with a boolean and an additive mask, B4 H16 S2048).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import importlib
import importlib.util
import json
import multiprocessing as mp
import sys
from pathlib import Path
from typing import Any

import torch

import tracea
from tracea_torch.bridge_attention import TORCH_SDPA

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import _time  # noqa: E402  (interleaved CUDA-event timing, the benchmark's own)


def load_baseline(path: str) -> Any:
    """The baseline ``emit`` package at ``path`` imported as ``baseline_emit`` (its relative imports resolve
    inside it)."""
    spec = importlib.util.spec_from_file_location("baseline_emit", f"{path}/__init__.py",
                                                  submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_emit"] = mod
    spec.loader.exec_module(mod)
    return mod


def _convert(spec: Any, cls: Any) -> Any:
    """``spec`` as an instance of the baseline's spec class (fields it lacks dropped)."""
    return cls(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(cls)})


def baseline_variants(path: str) -> dict[str, Any]:
    """Variant objects that compile the baseline emitters' kernels (by variant name)."""
    from tracea_cuda.variants.attention import FlashAttention
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    load_baseline(path)
    old_wg = importlib.import_module("baseline_emit.flash_wgmma")
    old_fa = importlib.import_module("baseline_emit.flash_attn")

    class OldWgmma(FlashAttentionWgmma):
        emitter = old_wg

        def spec(self, op: Any, config: Any, ptrs: Any = None, profile: Any = None) -> Any:
            return _convert(super().spec(op, config, ptrs, profile), old_wg.FlashWgmmaSpec)

        def bind(self, op: Any, config: Any, profile: Any, adapter: Any) -> Any:
            # the params this tree added (the baseline compiles the config without them)
            fields = {f.name for f in dataclasses.fields(old_wg.FlashWgmmaSpec)}
            drop = {k for k in ("tail", "edge_pv") if k not in fields}
            config = dataclasses.replace(config, params=tuple((k, v) for k, v in config.params if k not in drop))
            return super().bind(op, config, profile, adapter)

        def pack_params(self, maps: list, slots: list, scalars: list) -> Any:
            # a baseline from before the tail split's parameters (part, part_lse, arrivals, full, trun)
            if "int full" in old_wg.BODY:
                return super().pack_params(maps, slots, scalars)
            from tracea_cuda import tma

            return tma.pack([*maps, *slots[:2], *scalars[2:]])

    class OldFlash(FlashAttention):
        emitter = old_fa

        def spec(self, op: Any, config: Any, ptrs: Any = None, profile: Any = None) -> Any:
            return _convert(super().spec(op, config, ptrs, profile), old_fa.FlashSpec)

    return {OldWgmma.name: OldWgmma(), OldFlash.name: OldFlash()}


def _flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * (s * (s + 1) / 2 if causal else s * s) * d


def _configs(var: Any, op: Any, profile: Any, extra: list, heroes: int | None = None) -> list:
    seen, out = set(), []
    for c in var.hero_configs(op, profile)[:heroes] + extra:
        if c.key not in seen and var.validate_config(op, c, profile):
            seen.add(c.key)
            out.append(c)
    return out


def _extra(name: str, d: int, causal: bool) -> list:
    from tracea_cuda.variants.base import hero

    if name.endswith("wgmma"):
        def h(bm: int, bn: int, st: int, pers: bool = False, **kw: Any) -> Any:
            return hero(bm, bn, d, st, 4 * (bm // 64 + 1), pingpong=True, persistent=pers, **kw)
        if causal:
            return []
        # the tail split and the edge P V skip, each alone (the first hero has both)
        bm, bn = (128, 160) if d == 128 else (192, 128)
        out = [h(bm, bn, 2, True, tail=True), h(bm, bn, 2, True, edge_pv=True)]
        return out + ([h(128, 128, 2, True, tail=True), h(128, 176, 2, True, tail=True, edge_pv=True)] if d == 128
                      else [])
    return []


def _precompile(items: list[tuple[str, str, str]]) -> None:
    """Compile the kernels into the disk cache in parallel processes (NVRTC needs no CUDA context)."""
    with cf.ProcessPoolExecutor(max_workers=min(16, max(1, len(items))), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_one, items))


def _compile_one(item: tuple[str, str, str]) -> None:
    from tracea_cuda import compiler

    compiler.precompile(*item)


def _sources(var: Any, op: Any, cfg: Any, profile: Any) -> list[tuple[str, str, str]]:
    """(source, kernel name, arch) of what ``var`` compiles for ``cfg``, through its own compile hooks."""
    from tracea_cuda import compiler

    got: list[tuple[str, str, str]] = []
    real = compiler.load

    def grab(source: str, name: str, arch: str, **_: Any) -> None:
        got.append((source, name, arch))

    compiler.load = grab  # type: ignore[assignment]
    try:
        if hasattr(var, "_kernels"):  # flash_mma: main (+ combine) kernels
            var._kernels(var.spec(op, cfg, None, profile), profile)
        else:
            var._kernel(var.spec(op, cfg, None, profile))
    finally:
        compiler.load = real  # type: ignore[assignment]
    return got


def probe(parts: list[str], dtypes: list[torch.dtype], baseline: str, heroes: int | None = None) -> list[dict]:
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention import FlashAttention
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_torch.adapter import TorchAdapter, device_of

    old = baseline_variants(baseline)
    new = {FlashAttentionWgmma.name: FlashAttentionWgmma(), FlashAttention.name: FlashAttention()}
    adapter = TorchAdapter()
    profile = get_doctor().profile_for(device_of(torch.device("cuda")))
    cases = []  # (B, H, KVH, S, D, causal, mask kind, variant)
    if "prefill" in parts:
        cases += [(4, 16, 16, 4096, d, c, None, FlashAttentionWgmma.name) for d in (128, 64) for c in (False, True)]
    if "gqa" in parts:
        cases += [(4, 32, 8, 4096, 128, c, None, FlashAttentionWgmma.name) for c in (False, True)]
    if "masked" in parts:  # the last: seq_kv not a multiple of 8 (mask rows not 16-byte aligned: plain loads)
        cases += [(4, 16, 16, 2048, d, False, m, FlashAttention.name) for d in (128, 64) for m in ("bool", "additive")]
        cases += [(4, 16, 16, 2047, 128, False, "bool", FlashAttention.name)]
    plan = []
    for dt in dtypes:
        for b, h, kvh, s, d, causal, mkind, vname in cases:
            op = AttentionOp(b, h, s, s, d, kv_heads=kvh, causal=causal, dtype=str(dt).split(".")[1], mask=mkind,
                             mask_shape=(b, 1) if mkind else None)
            cfgs = _configs(new[vname], op, profile, _extra(vname, d, causal), heroes)
            plan.append((dt, b, h, kvh, s, d, causal, mkind, vname, op, cfgs))
    items = {}
    for *_, vname, op, cfgs in plan:
        for c in cfgs:
            for src in _sources(new[vname], op, c, profile) + _sources(old[vname], op, c, profile):
                items[src[:2]] = src
    _precompile(list(items.values()))
    print(f"precompiled {len(items)} kernels", flush=True)

    rows = []
    for dt, b, h, kvh, s, d, causal, mkind, vname, op, cfgs in plan:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, s, d, device="cuda", dtype=dt, generator=g)
        k, v = (torch.randn(b, kvh, s, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
        mask = None
        if mkind == "bool":  # packed (B, 1, S, S): a random ~70% of keys visible, at least key 0 per row
            mask = torch.rand(b, 1, s, s, device="cuda", generator=g) < 0.7
            mask[..., 0] = True
        elif mkind == "additive":
            mask = torch.where(torch.rand(b, 1, s, s, device="cuda", generator=g) < 0.7, 0.0,
                               torch.finfo(dt).min).to(dt)
        gqa = kvh != h
        args = dict(is_causal=causal, enable_gqa=gqa)
        ref = TORCH_SDPA(q, k, v, mask, **args)
        # the kernels' mask operand: the plan's packed array of the input dtype (bool: 1 / 0)
        kmask = None if mask is None else (mask.to(dt) if mask.dtype == torch.bool else mask)
        fns, names, outs = [lambda q=q, k=k, v=v, m=mask, a=args: TORCH_SDPA(q, k, v, m, **a)], ["sdpa"], []
        for cfg in cfgs:
            for side, var in (("new", new[vname]), ("old", old[vname])):
                launch = var.bind(op, cfg, profile, adapter)
                out = torch.empty(b, h, s, d, device="cuda", dtype=dt)
                outs.append((f"{side} {cfg.key}", out))
                fns.append(lambda launch=launch, out=out, q=q, k=k, v=v, m=kmask: launch(q, k, v, m, out))
                names.append(f"{side} {cfg.key}")
        if mask is not None:  # what converting the mask costs (each call did it before the plan kept it)
            fns.append(lambda m=mask, shape=kmask.shape, dt=dt: torch.empty(shape, dtype=dt, device="cuda").copy_(m))
            names.append("mask conversion")
        kern = _time(fns, 10, True)
        user = _time([lambda q=q, k=k, v=v, m=mask, a=args: tracea.ops.attention(q, k, v, m, **a), fns[0]], 10, False)
        fl = _flops(b, h, s, d, causal) * (1 if mkind is None else 1)
        errs = {n: float((o.double() - ref.double()).norm() / ref.double().norm()) for n, o in outs}
        row = dict(dtype=str(dt).split(".")[1], b=b, h=h, kvh=kvh, s=s, d=d, causal=causal, mask=mkind,
                   variant=vname.split(".")[-1], sdpa_tflops=round(fl / kern[0] / 1e12, 1),
                   user_ratio=round(user[1] / user[0], 3),
                   kernels={n: [round(fl / t / 1e12, 1), round(kern[0] / t, 3)] for n, t in zip(names[1:], kern[1:])},
                   max_rel_err=max(errs.values()))
        rows.append(row)
        print(f"{row['dtype']} b{b} h{h}/{kvh} s{s} d{d} causal={int(causal)} mask={mkind} {row['variant']}: "
              f"sdpa {row['sdpa_tflops']} TF/s, user path {row['user_ratio']}x, max rel err {row['max_rel_err']:.2e}",
              flush=True)
        if mask is not None:
            print(f"    mask conversion {kern[-1] * 1e6:.1f} us (default kernel {kern[1] * 1e6:.1f} us)", flush=True)
        for cfg in cfgs:
            a, o = row["kernels"][f"new {cfg.key}"], row["kernels"][f"old {cfg.key}"]
            print(f"    {cfg.key:60s} new {a[0]:6.1f} ({a[1]:.3f}x)  old {o[0]:6.1f} ({o[1]:.3f}x)  "
                  f"new/old {a[0] / o[0]:.3f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="path of the baseline tracea_cuda/emit folder")
    ap.add_argument("--parts", default="prefill,gqa,masked")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--heroes", type=int, help="only the first N hero configs of each shape (and the extras)")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    rows = probe(args.parts.split(","), [getattr(torch, t) for t in args.dtypes.split(",")], args.baseline,
                 args.heroes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
