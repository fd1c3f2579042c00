"""``tracea doctor``: devices, backends, plugins, variants, fallbacks, and why a variant is chosen."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..doctor.doctor import get_doctor
from ..doctor.report import build_report
from .opspec import parse_op
from .table import render, section


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="report devices, backends and variants; explain decisions for ops",
                       description="Report what Tracea found on this machine. With --op, explain which variant "
                                   "would run the op and why every other variant was rejected.")
    p.add_argument("--op", action="append", default=[], metavar="SPEC",
                   help="an op to explain, e.g. 'gemm:m=1024,n=1024,k=1024,dtype=f16,epilogue=bias+gelu' "
                        "or 'conv2d:n=8,c=64,h=56,w=56,k=64,r=3,padding=1' (repeatable)")
    p.add_argument("--device", default=None, help="device for --op decisions (default: the best device)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    ops = [parse_op(s) for s in args.op]
    report = build_report(get_doctor(), ops, args.device)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render_text(report))
    return 0


def _caps(d: dict[str, Any]) -> str:
    bits = []
    if d.get("compute_capability"):
        bits.append("cc " + ".".join(map(str, d["compute_capability"])))
    isa = [f for f in d.get("isa", []) if not f.startswith("isa:")]
    if isa:
        bits.append(" ".join(isa))
    best = d.get("extras", {}).get("isa_summary") or d.get("extras", {}).get("best_isa")
    if best:
        bits.append(f"(best ISA: {best})")
    return "; ".join(bits)


def _us(seconds: Any) -> str:
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        return "?"
    return f"{value * 1e6:.1f} us" if value >= 0 else "-"


def _how(c: dict[str, Any]) -> str:
    """How a candidate's estimate was reached: the model's method and the roofline it started from."""
    est = c.get("estimate")
    if not est:
        return "roofline"
    if est.get("method") == "roofline":
        return "roofline (no data)"
    return f"{est['method']} ({float(est['roofline_s']) * 1e3:.4g} ms)"


def _cache(d: dict[str, Any]) -> str:
    return " ".join(f"{k} {v // 1024} KiB" for k, v in d.get("caches", {}).items() if v)


def render_text(r: dict[str, Any]) -> str:
    out = [f"Tracea {r['tracea_version']} doctor report  (Python {r['python']}, {r['platform']})"]
    out.append(section("Devices"))
    out.append(render(["device", "name", "backend", "arch", "units", "capabilities", "caches"],
                      [[d["device"], d["name"], d["backend"], d["arch"], d["compute_units"], _caps(d), _cache(d)]
                       for d in r["devices"]]))
    out.append(f"  best device: {r['best_device']}")
    out.append(section("Backends"))
    out.append(render(["backend", "version", "package", "available", "notes"],
                      [[b["name"], b["version"], b["package"], "yes" if b["available"] else "no",
                        b["reason"] or ", ".join(f"{k}={v}" for k, v in b["details"].items())]
                       for b in r["backends"]]))
    for m in r["version_mismatches"]:
        out.append(f"  WARNING version mismatch: {m}")
    out.append(section("Plugins"))
    out.append(render(["plugin", "source"], [[p["name"], p["source"]] for p in r["plugins"]]))
    for name, err in r["plugin_errors"].items():
        out.append(f"  FAILED to load plugin {name}: {err}")
    for err in r["registry_errors"]:
        out.append(f"  REGISTRY ERROR: {err}")
    if r.get("recommendations"):
        out.append(section("Recommended backends for this machine"))
        out.append(render(["package", "install", "why"],
                          [[x["package"], x["install"], x["why"]] for x in r["recommendations"]], max_col=100))
    out.append(section("Kernel variants"))
    out.append(render(["variant", "backend", "op", "device", "description"],
                      [[v["name"], v["backend"], v["op"], v["device_kind"], v["description"]] for v in r["variants"]]))
    if r["fallbacks"]:
        out.append(section("Framework fallbacks in this process"))
        out.append(render(["op", "count", "reason"], [[f["op"], f["count"], f["reason"]] for f in r["fallbacks"]]))
    if r.get("verdicts"):
        out.append(section("Arbiter verdicts (tuning cache): who serves each patched-layer signature"))
        out.append(render(["op", "device", "winner", "tracea variant", "tracea", "framework", "note"],
                          [[v["op"], v["device"], v["winner"], v["tracea_variant"], _us(v["tracea_s"]),
                            _us(v["framework_s"]), v["note"]] for v in r["verdicts"]], max_col=60))
    plan_stats = r.get("plans") or {}
    if plan_stats:
        out.append(f"  call plans in this process: {plan_stats.get('plans', 0)} stored, {plan_stats.get('builds', 0)} "
                   f"built, {plan_stats.get('invalidations', 0)} invalidations")
    for d in r["decisions"]:
        out.append(section(f"Decision: {d['describe']} on {d['device']}"))
        if d.get("ok"):
            ch = d["chosen"]
            why = (f"tuned median {ch['measured_s'] * 1e3:.3f} ms" if ch["measured_s"] is not None
                   else f"estimated {ch['estimate_s'] * 1e3:.3f} ms")
            out.append(f"  chosen: {ch['variant']} with {ch['source']} config {ch['config']} ({why})")
            rows = [[c["variant"], c["source"], c["config"],
                     f"{c['measured_s'] * 1e3:.3f} ms (tuned)" if c["measured_s"] is not None
                     else f"{c['estimate_s'] * 1e3:.4g} ms (estimate)", _how(c)] for c in d["candidates"]]
            out.append(render(["accepted (ranked)", "source", "config", "time", "estimated by (roofline)"], rows,
                              max_col=60))
            if d.get("model"):
                out.append(f"  ranking of untuned candidates: {d['model']}")
            for c in d["candidates"]:
                est = c.get("estimate") or {}
                if est.get("method") in ("knn", "calibrated"):
                    near = "; ".join(f"{n['op']} {n['seconds'] * 1e3:.4g} ms (d={n['distance']:.2f})"
                                     for n in est.get("neighbors", [])[:4])
                    out.append(f"  {c['variant']}: {est.get('detail', '')}" + (f"\n      data near: {near}" if near else ""))
                if c.get("note"):
                    out.append(f"  {c['variant']}: {c['note']}")
        else:
            out.append(f"  NO VARIANT: {d['error']}")
        if d.get("elsewhere"):
            out.append(f"  variants for other device kinds: {', '.join(d['elsewhere'])}")
        if d["rejected"]:
            out.append(render(["rejected", "reasons"], [[x["variant"], "; ".join(x["reasons"])] for x in d["rejected"]],
                              max_col=90))
    return "\n".join(out)
