"""Probe of the Hopper GEMM (``cuda.gemm.wgmma``) on LLM prefill projections (``x @ W.T``, bf16, M = 512-4096
tokens): per shape, PyTorch's kernel time against the default hero, the next heroes first-use tuning would time,
and a fixed set of candidate configs (tile shapes that quantize the waves differently, stream-K, split-K,
clusters, pipeline depth, the deferred epilogue), so the hero rule follows measurements.

Kernel times are calls replayed from a CUDA graph (device time only); every config also runs eagerly back to
back (host time included: configs that take the multi-launch ``run`` path, e.g. stream-K, pay it there), and
the default runs on the user path (``tracea.ops.matmul``, paired with PyTorch). Ratios are torch time / tracea
time; ``err`` is the largest relative error of any config against a float32 product of the same inputs.

    python benchmarks/cuda/probe_prefill.py [--shapes MxNxK,...] [--configs label,...] [--jobs 12]
                                            [--json out.json] [--paired --rounds 9]

Under sustained bf16 GEMM load an H100's clocks move by several percent between two measurements of one shape
(two schedules of one kernel differed by 12% in the sweep above). ``--paired`` therefore times the first three
heroes (what first-use tuning times) and the ``--configs`` against PyTorch interleaved: per round every
candidate's CUDA graph of 10 calls is replayed once (kernel time) and every candidate runs 10 eager calls back
to back (user path with the config forced), in alternating order; medians over ``--rounds``. ``default`` is
``tracea.ops.matmul`` untuned (the Doctor's choice).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from typing import Any

import torch

import tracea
from tracea.ir.ops import GemmOp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
sys.path.insert(0, os.path.dirname(__file__))
from bench_shapes import b2b, graph_time, paired, rel  # noqa: E402
from probe_tile_n import precompile  # noqa: E402

from tracea_cuda.variants.hopper import WgmmaGemm, _hero  # noqa: E402

#: the bench_shapes prefill group (7B / 13B / 70B projections at M 512 and 2048), then shapes it lacks
#: (TinyLlama 2048/5632, Llama-3-8B 4096/14336, Qwen-1.5B 1536/8960, 3072-wide models, M 1024 / 3000 / 4096)
SHAPES = ["512x4096x4096", "2048x4096x4096", "512x11008x4096", "2048x11008x4096", "512x4096x11008",
          "2048x4096x11008", "512x5120x5120", "2048x5120x5120", "512x13824x5120", "2048x13824x5120",
          "512x8192x8192", "2048x8192x8192", "512x28672x8192", "2048x28672x8192", "512x1024x8192",
          "2048x1024x8192",
          "2048x5632x2048", "2048x2048x5632", "2048x2048x2048", "1024x14336x4096", "4096x14336x4096",
          "3000x4096x4096", "4096x3072x3072", "1024x1536x1536", "4096x1536x8960", "1024x4096x14336"]

#: label -> (tile_n, stages, params of ``_hero``)
CANDIDATES: dict[str, tuple[int, int, dict]] = {
    "256": (256, 4, {}),
    "256d": (256, 3, {"group_m": 16, "defer": True}),
    "256g16": (256, 4, {"group_m": 16}),
    "m256x128": (128, 4, {"bm": 256}),
    "256c2": (256, 4, {"cluster": 2}),
    "m256x128c2": (128, 4, {"bm": 256, "cluster": 2}),
    "256sk": (256, 4, {"stream_k": True}),
    "256dsk": (256, 3, {"group_m": 16, "defer": True, "stream_k": True}),
    "m256x128sk": (128, 4, {"bm": 256, "stream_k": True}),
    "128": (128, 6, {}),
    "128pp": (128, 6, {"schedule": "pingpong"}),
    "192": (192, 4, {}),
    "192sk": (192, 4, {"stream_k": True}),
    "176": (176, 5, {}),
    "224": (224, 4, {}),
    "240": (240, 4, {}),
    "160": (160, 5, {}),
    "256s2": (256, 4, {"split_k": 2}),
    "128s2": (128, 6, {"split_k": 2}),
}


def parse(s: str) -> tuple[int, int, int]:
    m, n, k = (int(v) for v in s.split("x"))
    return m, n, k


def op_of(m: int, n: int, k: int) -> GemmOp:
    return GemmOp(m, n, k, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")


def configs_for(op: GemmOp, profile: Any, labels: list[str]) -> dict[str, Any]:
    """label -> config: the first three heroes (h0 is the default), then the candidates (duplicates dropped)."""
    v = WgmmaGemm()
    out: dict[str, Any] = {f"h{i}": c for i, c in enumerate(v.hero_configs(op, profile)[:3])}
    for label in labels:
        bn, st, params = CANDIDATES[label]
        c = _hero(bn, st, **{"cluster": 1, **params})
        if c not in out.values():
            out[label] = c
    return {k: c for k, c in out.items() if v.validate_config(op, c, profile)}


def measure(s: str, cs: dict[str, Any]) -> dict[str, Any]:
    m, n, k = parse(s)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    wt = w.t()
    ref = x.float() @ wt.float()
    t_torch = graph_time(lambda: x @ wt)
    t_user, t_torch_user, _ = paired(lambda: tracea.ops.matmul(x, wt), lambda: x @ wt)
    row: dict[str, Any] = {"shape": s, "torch_s": t_torch, "user_s": t_user, "torch_user_s": t_torch_user,
                           "torch_eager_s": b2b(lambda: x @ wt, 30), "configs": {}}
    for label, cfg in cs.items():
        fn = lambda cfg=cfg: tracea.ops.matmul(x, wt, variant="cuda.gemm.wgmma", config=cfg)  # noqa: E731
        try:
            err = rel(fn(), ref)
            row["configs"][label] = {"config": cfg.key, "tile": f"{cfg.tile_m}x{cfg.tile_n}", "s": graph_time(fn),
                                     "eager_s": min(b2b(fn, 30) for _ in range(3)), "err": err}
        except Exception as exc:  # noqa: BLE001 - a probe reports a failing config and goes on
            row["configs"][label] = {"config": cfg.key, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return row


def _graph(fn: Any, calls: int) -> Any:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def _timed(work: Any, calls: int) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    work()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / calls


def measure_paired(s: str, cs: dict[str, Any], rounds: int, calls: int = 10) -> dict[str, Any]:
    """Kernel (graph replay) and eager seconds per call of PyTorch, the untuned default and ``cs``,
    interleaved (see the module docstring); prints one line of ratios torch / candidate."""
    m, n, k = parse(s)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    wt = w.t()
    ref = x.float() @ wt.float()
    fns: dict[str, Any] = {"torch": lambda: x @ wt, "default": lambda: tracea.ops.matmul(x, wt)}
    for label, cfg in cs.items():
        fns[label] = lambda cfg=cfg: tracea.ops.matmul(x, wt, variant="cuda.gemm.wgmma", config=cfg)
    errs = {lab: rel(fn(), ref) for lab, fn in fns.items() if lab != "torch"}
    graphs = {lab: _graph(fn, calls) for lab, fn in fns.items()}
    kern: dict[str, list[float]] = {lab: [] for lab in fns}
    eager: dict[str, list[float]] = {lab: [] for lab in fns}
    labels = list(fns)
    for r in range(rounds):
        for lab in labels if r % 2 == 0 else labels[::-1]:
            kern[lab].append(_timed(graphs[lab].replay, calls))
            fn = fns[lab]
            torch.cuda.synchronize()
            eager[lab].append(_timed(lambda fn=fn: [fn() for _ in range(calls)], calls))
    med = {lab: (statistics.median(kern[lab]), statistics.median(eager[lab])) for lab in labels}
    t_k, t_e = med["torch"]
    row = {"shape": s, "torch_s": t_k, "torch_eager_s": t_e, "configs": {
        lab: {"config": cs[lab].key if lab in cs else "default", "s": med[lab][0], "eager_s": med[lab][1],
              "err": errs[lab], "tile": f"{cs[lab].tile_m}x{cs[lab].tile_n}" if lab in cs else ""}
        for lab in labels if lab != "torch"}}
    cf = "  ".join(f"{lab}{'(' + v['tile'] + ')' if v['tile'] else ''} {t_k / v['s']:4.2f}/{t_e / v['eager_s']:4.2f}"
                   for lab, v in row["configs"].items())
    print(f"{s:<16} torch {t_k * 1e6:7.1f} us | kernel/eager: {cf}  err {max(errs.values()):.0e}", flush=True)
    return row


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--configs", default=",".join(CANDIDATES))
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--json", default="")
    p.add_argument("--paired", action="store_true", help="interleaved rounds against PyTorch (see above)")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    profile = tracea.get_doctor().profile_for("cuda:0")
    print(f"{torch.cuda.get_device_name()} ({profile.compute_units} SMs); ratios are torch time / tracea time "
          f"(kernel: graph replay; eager: back-to-back calls)")
    labels = [c for c in args.configs.split(",") if c]
    plan = [(s, op_of(*parse(s)), None) for s in args.shapes.split(",") if s]
    plan = [(s, op, configs_for(op, profile, labels)) for s, op, _ in plan]
    if args.jobs:
        precompile(plan, args.jobs)
    rows = []
    for s, _op, cs in plan:
        if args.paired:
            try:
                rows.append(measure_paired(s, cs, args.rounds))
            except Exception:  # noqa: BLE001
                print(f"{s}: {traceback.format_exc(limit=3)}", flush=True)
            continue
        try:
            row = measure(s, cs)
        except Exception:  # noqa: BLE001
            print(f"{s}: {traceback.format_exc(limit=2)}", flush=True)
            continue
        t = row["torch_s"]
        ok = {lab: v for lab, v in row["configs"].items() if "s" in v}
        best = min(ok, key=lambda lab: ok[lab]["s"]) if ok else "-"
        cf = "  ".join(f"{lab}({v['tile']}) {t / v['s']:4.2f}/{row['torch_eager_s'] / v['eager_s']:4.2f}"
                       if "s" in v else f"{lab} FAIL" for lab, v in row["configs"].items())
        print(f"{s:<16} torch {t * 1e6:7.1f} us | user {row['torch_user_s'] / row['user_s']:4.2f}x | best {best} "
              f"{t / ok[best]['s'] if ok else 0:4.2f} | kernel/eager: {cf}  "
              f"err {max((v['err'] for v in ok.values()), default=0):.0e}", flush=True)
        for lab, v in row["configs"].items():
            if "error" in v:
                print(f"    {lab}: {v['error']}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
