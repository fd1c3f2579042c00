"""``tracea tune``: tune one op, or a small graph described in JSON, and store the results in the cache.

Op specs (as ``tracea doctor``): ``gemm:m=1024,n=1024,k=1024,dtype=f16``, the shorthand
``gemm:1024x1024x1024``, ``conv2d:n=8,c=64,h=56,w=56,k=64,r=3,padding=1`` or
``attention:batch=1,heads=8,seq_q=512,head_dim=64`` (pairs are written ``2x2``).
A graph file is ``{"iterations": 30, "goal": "balanced", "nodes": [{"kind": "gemm", "m": 64, ...}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import InvalidArgumentError, TraceaError
from .rst import plain
from .table import aligned

def parse_op_spec(spec: str) -> Any:
    """Build an op from a command-line spec: ``gemm:MxNxK`` / ``gemm:BxMxNxK`` shorthand, else
    :func:`tracea.cli.opspec.parse_op` (``kind:field=value,...``)."""
    from ..ir.ops import GemmOp
    from .opspec import parse_op

    kind, _, rest = spec.strip().partition(":")
    rest = rest.strip()
    if kind.strip().lower() == "gemm" and rest and "=" not in rest:
        dims = rest.lower().split("x")
        if len(dims) not in (3, 4) or not all(d.isdigit() for d in dims):
            raise InvalidArgumentError("op", spec, "gemm:MxNxK, gemm:BATCHxMxNxK or gemm:m=..,n=..,k=..")
        vals = [int(d) for d in dims]
        return GemmOp(*vals[-3:], batch=vals[0] if len(vals) == 4 else 1)  # type: ignore[arg-type,misc]
    return parse_op(spec)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("tune", help="tune an op or a graph and store the best configs in the cache",
                              description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", nargs="?", help="op spec, e.g. gemm:1024x1024x1024 (or use --graph)")
    p.add_argument("--graph", metavar="FILE", help="JSON graph description to tune instead of one op")
    p.add_argument("--device", default=None,
                   help="device to tune on (default: the best device present, as tracea doctor shows)")
    p.add_argument("--trials", type=int, default=None,
                   help="measured configs per variant (default 40); for --graph the total budget (default 15)")
    p.add_argument("--goal", default=None, help="max_tflops (default), min_latency or balanced")
    p.add_argument("--variant", default=None, help="tune only this variant")
    p.add_argument("--timeout", type=float, default=None, help="wall-clock budget in seconds")
    p.add_argument("--seed", type=int, default=None, help="sampler seed")
    p.add_argument("--sampler", default="auto", choices=["auto", "gp", "optuna-gp", "tpe", "random"])
    p.add_argument("--force", action="store_true", help="retune even when the cache has a result")
    p.add_argument("--cache", metavar="FILE", default=None, help="tuning cache file (default: TRACEA_CACHE_PATH "
                   "or ./.tracea/tuning_cache.json)")
    p.add_argument("--plot", metavar="PNG", default=None, help="save the convergence plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..tuning.autotuner import AutoTuner
    from ..tuning.cache import TuningCache, get_cache

    try:
        cache = TuningCache(args.cache) if args.cache else get_cache()
        if args.graph:
            return _run_graph(args, cache)
        if not args.op:
            print("tracea tune: give an op spec (e.g. gemm:512x512x512) or --graph FILE", file=sys.stderr)
            return 2
        op = parse_op_spec(args.op)
        tuner = AutoTuner(None, goal=args.goal or "max_tflops", trials=args.trials or 40,
                          timeout_s=args.timeout, seed=args.seed, cache=cache,
                          progress=not args.no_progress, sampler=args.sampler)
        result = tuner.tune(op, args.device, args.variant, force=args.force)
        if args.plot:
            if result.from_cache:
                print("note: result came from the cache, nothing to plot (use --force)", file=sys.stderr)
            else:
                print(f"convergence plot: {result.plot(args.plot)}", file=sys.stderr)
        if args.json:
            print(json.dumps(result.to_json(), indent=1))
        else:
            print(format_result(result, cache.path))
        return 0 if result.ok else 1
    except TraceaError as exc:
        print(f"tracea tune: {exc}", file=sys.stderr)
        return 2


def format_result(result: Any, cache_path: str) -> str:
    lines = [f"{result.op.describe()} on {result.device}, goal {result.goal.name} ({result.goal.label}), "
             f"sampler {result.sampler}, {result.elapsed_s:.1f} s"]
    rows = [("variant", "source", "trials", "failed", "pruned", "best", "GFLOP/s", "config")]
    for name, vr in result.variants.items():
        pruned = sum(1 for t in vr.trials if t.status == "invalid")
        failed = sum(1 for t in vr.trials if not t.ok) - pruned
        best = f"{vr.median_s * 1e6:.2f} us" if vr.config else "no valid config"
        gf = f"{result.op.flops / vr.median_s / 1e9:.1f}" if vr.config and vr.median_s > 0 else "-"
        rows.append((name, "cache" if vr.from_cache else "tuned", str(len(vr.trials) - pruned), str(failed),
                     str(pruned), best, gf,
                     vr.config.key if vr.config else "-"))
    lines += aligned(rows, indent="  ")
    if result.ok:
        lines.append(f"best: {result.variant} {result.config.key} ({result.median_s * 1e6:.2f} us median)")
    reasons: dict[str, str] = {}
    for t in result.history:
        if not t.ok:
            reasons.setdefault(t.status, t.reason)
    for status, reason in reasons.items():
        lines.append(f"  {status}: e.g. {reason}")
    lines.append(f"cache: {cache_path}")
    return "\n".join(lines)


def _run_graph(args: argparse.Namespace, cache: Any) -> int:
    from ..ir.ops import op_from_dict
    from ..tuning.graph import optimize_graph

    try:
        with open(args.graph, encoding="utf-8") as f:
            desc = json.load(f)
    except OSError as exc:
        raise InvalidArgumentError("--graph", args.graph, "a readable JSON graph file",
                                   hint=exc.strerror or str(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError("--graph", args.graph, "a JSON graph file", hint=f"not valid JSON: {exc}") from None
    if not isinstance(desc, dict) or not isinstance(desc.get("nodes"), list) or not desc["nodes"]:
        raise InvalidArgumentError("--graph", args.graph, 'a JSON object with a non-empty "nodes" list')
    ops = [op_from_dict(dict(n)) for n in desc["nodes"]]
    report = optimize_graph(ops, iterations=args.trials or int(desc.get("iterations", 15)),
                            goal=args.goal or desc.get("goal", "max_tflops"), device=args.device,
                            progress=not args.no_progress, cache=cache, seed=args.seed)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.table())
        print(f"{report.measured_trials} trials measured in {report.elapsed_s:.1f} s; cache: {cache.path}")
    return 0 if all(e.result and e.result.ok for e in report.entries) else 1
