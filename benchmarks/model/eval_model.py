"""Quality of the performance model on held-out shapes: the old ranking (each variant's roofline estimate
with its hand-set efficiency) against the fitted model, on measured data it was not fitted on.

    source scripts/srcenv.sh && python benchmarks/model/eval_model.py [DATA.json ...] [--split heldout|fit|all]

Default data: every file the installed backends ship (``tracea_perf_data`` hook). The model is fitted on
the ``fit`` rows only; ``heldout`` rows are whole shape families (other LLM sizes, other CNNs, other odd
sizes) it never saw. For every op with at least two measured variants it prints, per precision and
overall:

- rank correlation (Spearman) between estimated and measured times over all (op, variant) pairs;
- top-1 hit rate: how often the variant ranked first is the measured fastest;
- regret: measured time of the pick / measured time of the best, minus 1 (mean, and the worst);
- median |log error| of the estimates (a factor: 1.25x means estimates are typically 25% off).

Also the anchor (PyTorch) ratio of the pick, when the file holds anchor times: what an untuned user
would get against cuBLAS / cuDNN / NumPy with each ranking.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections import defaultdict

import numpy as np

from tracea.doctor import get_doctor
from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.perfmodel import PerfModel, load_file
from tracea.perfmodel.features import group_key
from tracea.perfmodel.model import _TileConfig, roofline_estimate


def profile_from_dict(d: dict) -> DeviceProfile:
    """The measuring device's profile, as the data file recorded it."""
    kw = dict(d)
    kw["device"] = Device.parse(kw["device"])
    for name in ("isa",):
        kw[name] = tuple(kw.get(name) or ())
    if kw.get("compute_capability"):
        kw["compute_capability"] = tuple(kw["compute_capability"])
    return DeviceProfile(**kw)


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def evaluate(path: str, split: str) -> int:
    f = load_file(path)
    if not f.ok:
        print(f"{path}: not usable: {f.problem}")
        return 1
    if f.profile is None:
        print(f"{path}: holds no device profile; cannot evaluate offline")
        return 1
    profile = profile_from_dict(f.profile)
    variants = {v.name: v for v in get_doctor().registry}
    model = PerfModel.fit(f.arch_key, f.observations, variants, profile, [os.path.basename(path)])
    anchor = {a[0]: a[1] for a in f.anchor}
    by_op: dict = defaultdict(list)
    for o in f.observations:
        if (split == "all" or o.split == split) and o.variant in variants:
            by_op[o.op].append(o)
    rows = defaultdict(lambda: defaultdict(list))  # label -> metric lists
    methods = defaultdict(int)
    for op, obs in by_op.items():
        if len(obs) < 2:
            continue
        label = "/".join(str(x) for x in group_key(op)[:3] if x != "")
        meas = [o.seconds for o in obs]
        best = min(meas)
        old, new = [], []
        for o in obs:
            v = variants[o.variant]
            cfg = _TileConfig(o.tile) if o.tile != (0, 0) else None
            old.append(float(v.estimate_seconds(op, profile, None)))
            est = model.estimate(v, op, profile, cfg, roofline_estimate(v, op, profile, cfg))
            methods[est.method] += 1
            new.append(est.seconds)
        for name, est in (("roofline", old), ("model", new)):
            # ties broken by priority as the Doctor does
            pick = min(range(len(obs)), key=lambda i: (est[i], -variants[obs[i].variant].priority))
            for lab in (label, "all"):
                r = rows[lab]
                r[f"{name}.hit"].append(meas[pick] == best)
                r[f"{name}.regret"].append(meas[pick] / best - 1)
                r[f"{name}.pairs_est"].extend(math.log(e) for e in est)
                r[f"{name}.logerr"].extend(abs(math.log(e / m)) for e, m in zip(est, meas))
                if op in anchor:
                    r[f"{name}.vs_anchor"].append(anchor[op] / meas[pick])
            if name == "roofline":
                for lab in (label, "all"):
                    rows[lab]["pairs_meas"].extend(math.log(m) for m in meas)
                    if op in anchor:
                        rows[lab]["best.vs_anchor"].append(anchor[op] / best)
    print(f"{os.path.basename(path)}: {f.arch_key} ({f.device_name}), split={split}, "
          f"{sum(1 for o in by_op.values() if len(o) >= 2)} ops with >= 2 variants; "
          f"model fitted on {model.points} points; estimate methods used: {dict(methods)}")
    hdr = (f"{'group':<22} {'ops':>4} | {'rank corr':>17} | {'top-1 hit':>15} | {'mean regret':>15} | "
           f"{'worst regret':>15} | {'median |log err|':>17} | {'pick vs anchor (geomean)':>26}")
    print(hdr)
    print(f"{'':<22} {'':>4} | {'roofline  model':>17} | {'roofline model':>15} | {'roofline model':>15} | "
          f"{'roofline model':>15} | {'roofline  model':>17} | {'roofline model best':>26}")
    for lab in sorted(rows, key=lambda s: (s == "all", s)):
        r = rows[lab]
        n = len(r["model.hit"])

        def gm(xs):
            return math.exp(statistics.mean(math.log(x) for x in xs)) if xs else float("nan")

        print(f"{lab:<22} {n:>4} | {spearman(r['roofline.pairs_est'], r['pairs_meas']):>8.3f} "
              f"{spearman(r['model.pairs_est'], r['pairs_meas']):>8.3f} | "
              f"{statistics.mean(r['roofline.hit']):>7.0%} {statistics.mean(r['model.hit']):>7.0%} | "
              f"{statistics.mean(r['roofline.regret']):>7.1%} {statistics.mean(r['model.regret']):>7.1%} | "
              f"{max(r['roofline.regret']):>7.0%} {max(r['model.regret']):>7.0%} | "
              f"{math.exp(statistics.median(r['roofline.logerr'])):>7.2f}x "
              f"{math.exp(statistics.median(r['model.logerr'])):>8.2f}x | "
              f"{gm(r['roofline.vs_anchor']):>7.2f}x {gm(r['model.vs_anchor']):>6.2f}x {gm(r['best.vs_anchor']):>6.2f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--split", default="heldout", choices=("heldout", "fit", "all"))
    args = ap.parse_args()
    files = args.files
    if not files:  # every data file the backends of this checkout ship, whatever devices are here
        import glob

        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        files = sorted(glob.glob(os.path.join(root, "packages", "*", "src", "*", "perf_data", "*.json")))
    rc = 0
    for path in files:
        rc |= evaluate(path, args.split)
        print()
    return rc


if __name__ == "__main__":
    sys.exit(main())
