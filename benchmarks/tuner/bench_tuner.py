"""Tuner quality benchmark: how many measured trials the Bayesian tuner needs to get within 3 % of the
best config of a real search space, against random search.

Method (replay): every valid config of the space is measured once (warm-up, repeated timing with
rotating inputs, median; outputs checked against the reference), which gives the exhaustive best.
Then each searcher draws from those recorded times instead of re-measuring, so every searcher sees the
same numbers and the comparison is cheap and fair. For each seed we count the trials until the best
so far is within ``--within`` (3 %) of the exhaustive best; the table shows the median over seeds.
Neither searcher gets hero configs (they would help both equally). Random search samples valid
configs uniformly without replacement; its expectation is (V + 1) / (K + 1) for V valid configs of
which K are within the bound.

    flock /tmp/tracea-bench.lock python benchmarks/tuner/bench_tuner.py               # GEMM 256^3
    python benchmarks/tuner/bench_tuner.py --op gemm:512x512x512 --variant cpu.gemm.avx2 --seeds 20

The space measurement is saved to ``--record`` (JSON) and reused when the same variant/op/space is
asked again (``--remeasure`` to force).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# One BLAS thread: on a shared machine a multi-threaded BLAS inside the NumPy stand-in and the reference
# check makes times swing by 100x with the load. Set these variables yourself to override.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _setup_path() -> None:
    root = os.path.dirname(os.path.dirname(HERE))
    for pkg in sorted(os.listdir(os.path.join(root, "packages"))):
        src = os.path.join(root, "packages", pkg, "src")
        if os.path.isdir(src) and src not in sys.path:
            sys.path.insert(0, src)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


_setup_path()

from tracea.cli.tune_cmd import parse_op_spec  # noqa: E402
from tracea.doctor.doctor import get_doctor  # noqa: E402
from tracea.ir.device import Device  # noqa: E402
from tracea.semantic.config import PipelineConfig  # noqa: E402
from tracea.tuning.autotuner import AutoTuner  # noqa: E402
from tracea.tuning.goals import OptimizationGoal  # noqa: E402
from tracea.tuning.loop import Validator, search  # noqa: E402
from tracea.tuning.measure import Measurement  # noqa: E402
from tracea.tuning.search import RandomSearch, gp_available  # noqa: E402


def pick_variant(doctor, op, device, name):
    cands = [v for v, _ in doctor.candidates(op, device) if v.backend != "reference"]
    if name:
        found = [v for v in cands if v.name == name]
        if not found:
            sys.exit(f"variant {name} does not serve {op.describe()} on {device}; candidates: "
                     + ", ".join(v.name for v in cands))
        return found[0]
    real = [v for v in cands if v.backend != "npbench"]
    if real:  # the variant dispatch would run (the Doctor's first choice)
        chosen = doctor.decide(op, device, use_cache=False).candidates
        return next((c.variant for c in chosen if c.variant in real), real[0])
    import npkernel

    doctor.pm.register_plugin(npkernel, "npbench", "benchmark")
    from tracea.doctor.doctor import reset_doctor

    reset_doctor()
    doctor = get_doctor()
    return next(v for v, _ in doctor.candidates(op, device) if v.backend == "npbench")


def measure_space(variant, op, device, args):
    """Measure the valid configs once (resuming a partial record); returns (times by config key,
    validator, space, the configs that were measured)."""
    doctor = get_doctor()
    profile = doctor.profile_for(device)
    tuner = AutoTuner(profile, doctor=doctor, cache=False, progress=False, min_repeats=args.repeats,
                      max_repeats=args.repeats, budget_s=0.0, warmup=1)
    space = tuner._space(op, variant, profile)
    check = Validator(space, lambda c: None if variant.validate_config(op, c, profile) else "invalid")
    valid = [c for c in space if check.reason(c) is None]
    if args.max_configs and len(valid) > args.max_configs:
        valid = random.Random(12345).sample(valid, args.max_configs)  # a fixed random subset of the space
    record_path = args.record
    os.makedirs(os.path.dirname(os.path.abspath(record_path)), exist_ok=True)
    key = (f"{variant.name}|{op.key}|{profile.fingerprint()}|{args.max_configs}|"
           f"{json.dumps(space.to_dict(), sort_keys=True)}")
    times: dict[str, list[float]] = {}
    if os.path.exists(record_path) and not args.remeasure:
        with open(record_path) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            times = saved["times"]
            print(f"reusing {len(times)} recorded configs from {record_path}")
    todo = [c for c in valid if c.key not in times]
    if todo:
        measurer = tuner._measurer(op, profile)
        t0 = time.time()
        for i, c in enumerate(todo, 1):
            m = measurer.measure(variant, c)
            times[c.key] = m.times if m.ok else []
            if i % 25 == 0 or i == len(todo):
                _save(record_path, key, variant, op, times)
            if args.time_limit and time.time() - t0 > args.time_limit:
                print(f"measurement stopped by --time-limit after {i} configs", file=sys.stderr)
                break
        _save(record_path, key, variant, op, times)
        print(f"measured {len(times)}/{len(valid)} configs ({time.time() - t0:.1f} s this run)", file=sys.stderr)
    measured = [c for c in valid if c.key in times]
    keys = {c.key for c in measured}
    # Searchers draw only from the measured configs; the others count as pruned (never measured).
    validator = Validator(space, lambda c: check.reason(c) or (None if c.key in keys else "not measured"))
    return times, validator, space, measured


def _save(path, key, variant, op, times):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"key": key, "variant": variant.name, "op": op.key, "times": times}, f)
    os.replace(tmp, path)


def trials_to_reach(records, target):
    n = 0
    for r in records:
        if r.status == "invalid":
            continue
        n += 1
        if r.score_s <= target:
            return n
    return math.inf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gemm:256x256x256")
    p.add_argument("--device", default="cpu")
    p.add_argument("--variant", default=None, help="variant to tune (default: the Doctor's first choice among "
                                                   "real backends, else the NumPy stand-in)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--within", type=float, default=0.03)
    p.add_argument("--budget", type=int, default=60, help="trials per search run")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per config when measuring the space")
    p.add_argument("--samplers", default="auto,tpe", help="comma list of tuner samplers (auto = GP if available)")
    p.add_argument("--record", default=os.path.join(".tracea", "bench_tuner_space.json"),
                   help="where the space measurement is saved (default ./.tracea/bench_tuner_space.json)")
    p.add_argument("--remeasure", action="store_true")
    p.add_argument("--max-configs", type=int, default=0,
                   help="measure only a fixed random subset of this many valid configs (huge or slow spaces)")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="stop measuring after this many seconds (the record is kept; run again to resume)")
    p.add_argument("--measure-only", action="store_true", help="measure (or resume) the space, no searches")
    args = p.parse_args(argv)

    op = parse_op_spec(args.op)
    device = Device.parse(args.device)
    doctor = get_doctor()
    variant = pick_variant(doctor, op, device, args.variant)
    times, validator, space, valid = measure_space(variant, op, device, args)
    if args.measure_only:
        return 0
    goal = OptimizationGoal.MaximizeTFLOPS
    scores = {k: goal.score(v) if v else math.inf for k, v in times.items()}
    finite = sorted(s for s in scores.values() if math.isfinite(s))
    if not finite:
        print("no config ran correctly")
        return 1
    best = finite[0]
    target = best * (1 + args.within)
    k_near = sum(1 for s in finite if s <= target)
    V = len(valid)
    print(f"\nvariant {variant.name}, op {op.describe()}, {V} valid configs measured ({space.cardinality} in "
          f"the space before constraints), {len(finite)} ran correctly")
    print(f"exhaustive best {best * 1e3:.3f} ms ({op.flops / best / 1e9:.2f} GFLOP/s), worst "
          f"{finite[-1] * 1e3:.3f} ms; {k_near} configs within {args.within:.0%} of the best")

    def replay(config: PipelineConfig) -> Measurement:
        t = times.get(config.key)
        return Measurement(config, times=list(t)) if t else Measurement(config, status="error", reason="failed")

    budget = min(args.budget, V)
    rows = []
    random_runs = []
    for s in range(args.seeds):
        order = list(RandomSearch(valid, seed=1000 + s))
        n = next((i for i, c in enumerate(order, 1) if scores.get(c.key, math.inf) <= target), math.inf)
        random_runs.append(n)
    rows.append(("random", random_runs, 0.0))
    for name in [x.strip() for x in args.samplers.split(",") if x.strip()]:
        label = ("gp" if gp_available() else "tpe") if name == "auto" else name
        runs, t0 = [], time.time()
        for s in range(args.seeds):
            recs = search(space, replay, variant=variant.name, goal=goal, trials=budget, validator=validator,
                          sampler=name, seed=s)
            runs.append(trials_to_reach(recs, target))
        rows.append((f"tuner ({label})", runs, (time.time() - t0) / args.seeds))
    expected_random = (V + 1) / (k_near + 1)
    print(f"\ntrials to reach within {args.within:.0%} of the exhaustive best ({args.seeds} seeds, budget "
          f"{budget} trials; random's expectation {expected_random:.1f})")
    print(f"{'searcher':<14} {'median':>7} {'p25':>6} {'p75':>6} {'reached':>8} {'vs random':>10} {'s/run':>7}")
    rand_med = _median(random_runs)
    for label, runs, sec in rows:
        med = _median(runs)
        q = _quartiles(runs)
        reached = sum(1 for r in runs if r <= budget)
        ratio = rand_med / med if med and math.isfinite(med) else 0.0
        print(f"{label:<14} {_fmt(med):>7} {_fmt(q[0]):>6} {_fmt(q[1]):>6} {reached:>4}/{len(runs):<3} "
              f"{ratio:>9.2f}x {sec:>7.1f}")
    return 0


def _median(xs):
    return statistics.median([x if math.isfinite(x) else 1e9 for x in xs])


def _quartiles(xs):
    ys = sorted(x if math.isfinite(x) else 1e9 for x in xs)
    return ys[len(ys) // 4], ys[(3 * len(ys)) // 4]


def _fmt(x):
    return ">budget" if x >= 1e9 else f"{x:g}"


if __name__ == "__main__":
    sys.exit(main())
