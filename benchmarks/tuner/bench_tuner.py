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
asked again (``--remeasure`` to force). ``--replay RECORD`` replays a saved record on any machine, even
one without the device or the backend (the H200 record on a laptop): the space is rebuilt from the
dimensions stored in the record and the configs it measured are the valid ones.

    python benchmarks/tuner/bench_tuner.py --replay benchmarks/tuner/results/h200-cuda.gemm.wgmma-bf16-4096.json.gz
"""

from __future__ import annotations

import argparse
import gzip
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
from tracea.semantic.search_space import SearchSpace  # noqa: E402
from tracea.tuning.autotuner import AutoTuner  # noqa: E402
from tracea.tuning.goals import OptimizationGoal  # noqa: E402
from tracea.tuning.loop import Validator, search  # noqa: E402
from tracea.tuning.measure import Measurement  # noqa: E402
from tracea.tuning.search import RandomSearch, resolve_sampler  # noqa: E402


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
        saved = _read(record_path)
        if saved.get("key") == key and saved.get("repeats", args.repeats) == args.repeats:
            times = saved["times"]
            print(f"reusing {len(times)} recorded configs from {record_path}")
    # Pass p measures, in a shuffled order, every config with fewer than (p + 1) * repeats times (a
    # failed config has none and is not retried). Several passes put each config's runs at different
    # moments, so a burst of load from other processes hits one pass of a config, not all its runs.
    measurer, t0, stop = None, time.time(), False
    for p in range(args.passes):
        todo = [c for c in valid if c.key not in times or 0 < len(times[c.key]) < (p + 1) * args.repeats]
        random.Random(p).shuffle(todo)
        if todo and measurer is None:
            measurer = tuner._measurer(op, profile)
        for i, c in enumerate(todo, 1):
            m = measurer.measure(variant, c)
            times[c.key] = times.get(c.key, []) + m.times if m.ok else []
            if i % 25 == 0 or i == len(todo):
                _save(record_path, key, variant, op, times, args)
            if args.time_limit and time.time() - t0 > args.time_limit:
                print(f"measurement stopped by --time-limit in pass {p + 1} after {i} configs", file=sys.stderr)
                stop = True
                break
        if todo:
            print(f"pass {p + 1}: measured {len(todo)} configs ({time.time() - t0:.1f} s so far)", file=sys.stderr)
        if stop:
            break
    measured = [c for c in valid if c.key in times]
    keys = {c.key for c in measured}
    # Searchers draw only from the measured configs; the others count as pruned (never measured).
    validator = Validator(space, lambda c: check.reason(c) or (None if c.key in keys else "not measured"))
    return times, validator, space, measured


def load_replay(path):
    """A saved record without its device: (variant name, op or None, op key, times, validator, space,
    measured configs). The space is rebuilt from the dimensions in the record's key; the configs it
    measured are the valid ones (their keys must match configs of the rebuilt space)."""
    saved = _read(path)
    variant_name, op_key, _fp, _maxc, dims_json = saved["key"].split("|", 4)
    space = SearchSpace()
    for name, values in json.loads(dims_json).items():
        space = space.with_dim(name, values)
    times = saved["times"]
    measured = [c for c in space if c.key in times]
    missing = set(times) - {c.key for c in measured}
    if missing:
        sys.exit(f"{len(missing)} recorded configs are not in the rebuilt space, e.g. {sorted(missing)[0]}")
    keys = {c.key for c in measured}
    validator = Validator(space, lambda c: None if c.key in keys else "not measured")
    try:
        head, rest = op_key.split(":", 1)
        op = parse_op_spec(head + ":" + ",".join(x for x in rest.split(":") if not x.startswith("epilogue=")))
    except Exception:  # noqa: BLE001 - only used for the description and GFLOP/s
        op = None
    return variant_name, op, op_key, times, validator, space, measured


def _read(path):
    """A record, plain JSON or gzipped (``.json.gz``)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def _save(path, key, variant, op, times, args):
    """Write the record atomically; times rounded to the nanosecond (the clock's resolution), compact,
    gzipped when ``path`` ends in ``.gz`` (the default)."""
    tmp = path + ".tmp"
    data = {"key": key, "variant": variant.name, "op": op.key, "repeats": args.repeats, "passes": args.passes,
            "times": {k: [round(t, 9) for t in v] for k, v in times.items()}}
    with (gzip.open(tmp, "wt") if path.endswith(".gz") else open(tmp, "w")) as f:
        json.dump(data, f, separators=(",", ":"))
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
    p.add_argument("--samplers", default="auto,tpe",
                   help="comma list of tuner samplers: auto (the tuner's default), gp, optuna-gp, tpe, random")
    p.add_argument("--record", default=os.path.join(".tracea", "bench_tuner_space.json.gz"),
                   help="where the space measurement is saved (default ./.tracea/bench_tuner_space.json.gz; .json.gz records are gzipped)")
    p.add_argument("--remeasure", action="store_true")
    p.add_argument("--passes", type=int, default=1,
                   help="measure the space this many times over, in shuffled orders (each pass adds --repeats "
                        "runs per config; the median of all runs counts): filters bursts of load")
    p.add_argument("--max-configs", type=int, default=0,
                   help="measure only a fixed random subset of this many valid configs (huge or slow spaces)")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="stop measuring after this many seconds (the record is kept; run again to resume)")
    p.add_argument("--measure-only", action="store_true", help="measure (or resume) the space, no searches")
    p.add_argument("--replay", default=None, metavar="RECORD",
                   help="replay a saved record (no device or backend needed); ignores --op/--variant/--device")
    args = p.parse_args(argv)

    if args.replay:
        variant_name, op, op_desc, times, validator, space, valid = load_replay(args.replay)
        op_desc = op.describe() if op is not None else op_desc
    else:
        op = parse_op_spec(args.op)
        device = Device.parse(args.device)
        doctor = get_doctor()
        variant = pick_variant(doctor, op, device, args.variant)
        variant_name, op_desc = variant.name, op.describe()
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
    print(f"\nvariant {variant_name}, op {op_desc}, {V} valid configs measured ({space.cardinality} in "
          f"the space before constraints), {len(finite)} ran correctly")
    rate = f" ({op.flops / best / 1e9:.2f} GFLOP/s)" if op is not None else ""
    print(f"exhaustive best {best * 1e3:.3f} ms{rate}, worst "
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
    exact_median = random_median_exact(V, k_near)
    for name in [x.strip() for x in args.samplers.split(",") if x.strip()]:
        label = resolve_sampler(name)
        runs, t0 = [], time.time()
        for s in range(args.seeds):
            recs = search(space, replay, variant=variant_name, goal=goal, trials=budget, validator=validator,
                          sampler=name, seed=s)
            runs.append(trials_to_reach(recs, target))
        rows.append((f"tuner ({label})", runs, (time.time() - t0) / args.seeds))
    expected_random = (V + 1) / (k_near + 1)
    print(f"\ntrials to reach within {args.within:.0%} of the exhaustive best ({args.seeds} seeds, budget "
          f"{budget} trials; random's expectation {expected_random:.1f})")
    print(f"random search's exact median (all orders, not just {args.seeds} seeds): {exact_median}; "
          f"'vs random' divides it by each searcher's median")
    print(f"{'searcher':<14} {'median':>7} {'p25':>6} {'p75':>6} {'reached':>8} {'vs random':>10} {'s/run':>7}")
    for label, runs, sec in rows:
        med = _median(runs)
        q = _quartiles(runs)
        reached = sum(1 for r in runs if r <= budget)
        ratio = exact_median / med if med and math.isfinite(med) else 0.0
        print(f"{label:<14} {_fmt(med):>7} {_fmt(q[0]):>6} {_fmt(q[1]):>6} {reached:>4}/{len(runs):<3} "
              f"{ratio:>9.2f}x {sec:>7.1f}")
    print("trials per seed (seed 0 first; - = not reached within the budget):")
    for label, runs, _sec in rows:
        print(f"  {label:<14} " + " ".join("-" if r > budget else str(r) for r in runs))
    return 0


def random_median_exact(valid, near):
    """Median number of draws without replacement from ``valid`` configs until one of the ``near`` good
    ones comes up: the smallest t with P(first hit <= t) >= 1/2 (P(no hit in t) = C(V-K, t) / C(V, t))."""
    miss = 1.0
    for t in range(1, valid + 1):
        miss *= (valid - near - t + 1) / (valid - t + 1)
        if miss <= 0.5:
            return t
    return valid


def _median(xs):
    return statistics.median([x if math.isfinite(x) else 1e9 for x in xs])


def _quartiles(xs):
    ys = sorted(x if math.isfinite(x) else 1e9 for x in xs)
    return ys[len(ys) // 4], ys[(3 * len(ys)) // 4]


def _fmt(x):
    return ">budget" if x >= 1e9 else f"{x:g}"


if __name__ == "__main__":
    sys.exit(main())
