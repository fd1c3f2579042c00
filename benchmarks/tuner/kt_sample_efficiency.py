"""Sample efficiency of Tracea's default strategy against Kernel Tuner's strategies, on user kernels.

Method: every config of a kernel's space is compiled, checked against the reference and timed
(``measure``: ``tracea.tune_kernel(strategy="brute_force", cache=TABLE)``), which writes the table as a
Kernel Tuner cache file. On a loaded machine use ``--interleave R`` (C kernels): after the verified
sweep every config is timed once per round in R rounds of random order and ``time`` is the minimum
(interference only adds time; ``median`` is kept too). Then strategies are *replayed* over that table:

- Tracea's default (``tune_kernel``'s default strategy: the candidate-set GP sampler with a value-covering
  start, an additive GP kernel, local steps and a pair-covering stall rule),
  driven through ``tracea.usertune.strategies`` with the same space object ``tune_kernel`` builds;
- Kernel Tuner's ``bayes_opt``, ``random_sample`` and its default ``brute_force``, run by Kernel Tuner
  itself in its simulation mode on the same cache file (``kt-replay``, executed with a Python that has
  ``kernel_tuner`` installed: ``--kt-python``).

For each run we count the evaluations until the best time so far is within ``--within`` (3 %) of the
exhaustive best. Failed configs (compile errors, too many resources) count as evaluations for both
tools. Kernel Tuner's ``results`` list a config again when a strategy revisits it; such repeats are
served from its cache and do not count against its ``max_fevals``, so they are not counted here either
(Tracea never revisits). A run that never gets there within the budget counts as ``budget + 1`` (">").
Same seeds for both tools (Kernel Tuner 1.5.0's ``bayes_opt`` and ``random_sample`` give different
traces for the same seed from run to run, so its medians move by a few evaluations between runs).

    python benchmarks/tuner/kt_sample_efficiency.py measure --kernel matmul_c --table t.json --interleave 21
    python benchmarks/tuner/kt_sample_efficiency.py replay --kernel matmul_c --table t.json --kt-python /tmp/ktvenv/bin/python
    python benchmarks/tuner/kt_sample_efficiency.py summary matmul_c=t.json conv2d_c=u.json --budget 100 --kt-python ...
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "kernel_tuner"))

KERNELS = {  # module, kernel name, problem arguments for measure, lang
    "matmul_c": ("matmul_c", "matmul", {"n": 384}, "C"),
    "conv2d_c": ("conv2d_c", "conv2d", {"w": 512, "h": 512}, "C"),
    "stencil_c": ("stencil_c", "stencil", {"w": 2048, "h": 1024}, "C"),
    "vector_add_c": ("vector_add_c", "vector_add", {"size": 4 << 20}, "C"),
    "matmul_cuda": ("matmul_cuda", "matmul_kernel", {"n": 2048}, "CUDA"),
    "convolution_cuda": ("convolution_cuda", "convolution_kernel", {"h": 2048, "w": 2048}, "CUDA"),
    "stencil_cuda": ("stencil_cuda", "stencil_kernel", {"width": 4096, "height": 2048}, "CUDA"),
}


def _table(path: str) -> dict[str, Any]:
    text = Path(path).read_text().strip()
    if text[-3:] not in ("}\n}", "}}}"):
        text = text.rstrip(",") + "}\n}"
    return json.loads(text)


def measure(args: argparse.Namespace) -> None:
    import tracea

    mod_name, _, kwargs, _ = KERNELS[args.kernel]
    mod = importlib.import_module(mod_name)
    if args.precompile and KERNELS[args.kernel][3] == "CUDA":
        _precompile_cuda(mod, kwargs, args.jobs)
    if args.interleave:
        return _measure_interleaved(args, mod, kwargs)
    if args.rounds > 1:
        return _measure_rounds(args, mod, kwargs)
    results, env = mod.tune(tracea, **kwargs, strategy="brute_force", cache=args.table, tracea_cache=False,
                            iterations=args.iterations, quiet=True)
    ok = [r for r in results if "__error__" not in r]
    print(f"{args.kernel}: {len(results)} configs measured on {env['device_name']} ({len(ok)} ran), "
          f"best {min(r['time'] for r in ok):.4f} ms -> {args.table}")


class _Capture:
    """Stands in for the tuner module: records the arguments an example script passes to tune_kernel."""

    def tune_kernel(self, *args: Any, **kwargs: Any) -> Any:
        self.args, self.kwargs = args, kwargs
        return [], {}


def _measure_interleaved(args: argparse.Namespace, mod: Any, kwargs: dict[str, Any]) -> None:
    """``--interleave R``: one verified brute-force sweep through ``tune_kernel`` (compile, check against
    the answer, time once), then every config that ran is compiled once more and timed in R rounds, each
    round visiting the configs in a fresh random order (one run per config per round). Interference from
    other jobs then lands on random configs instead of on a stretch of the sweep. The table's ``time`` is
    the minimum over the rounds (interference only adds time), ``median`` the median, ``times`` all."""
    import random
    import tempfile

    import tracea
    from tracea.usertune.runner import get_runner
    from tracea.usertune.session import Session

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sweep.json")
        mod.tune(tracea, **kwargs, strategy="brute_force", cache=path, tracea_cache=False, iterations=1, quiet=True)
        table = _table(path)
    cap = _Capture()
    mod.tune(cap, **kwargs)
    name, source, problem, arguments, _params = cap.args
    kw = cap.kwargs
    runner = get_runner(kw.get("lang", "C"))
    session = Session(runner=runner, kernel_name=name, kernel_source=source, problem_size=problem, arguments=arguments,
                      args=runner.prepare_arguments(arguments),
                      grid_div=(kw.get("grid_div_x"), kw.get("grid_div_y"), kw.get("grid_div_z")),
                      block_size_names=["block_size_x", "block_size_y", "block_size_z"], lang=kw.get("lang", "C"),
                      compiler_options=tuple(kw.get("compiler_options") or ()), cmem_args=kw.get("cmem_args"))
    ran = {k: e for k, e in table["cache"].items() if isinstance(e.get("time"), (int, float))}
    names = table["tune_params_keys"]
    built = {}
    for key, e in ran.items():
        launch = session.launch_for({n: e[n] for n in names})
        built[key] = (runner.compile(launch), launch)
        e["times"] = []
    rng = random.Random(0)
    for _round in range(args.interleave):
        order = list(built)
        rng.shuffle(order)
        for key in order:
            kernel, launch = built[key]
            ran[key]["times"] += [float(t) for t in runner.benchmark(kernel, session.args, launch, 1)]
    for e in ran.values():
        e["median"] = statistics.median(e["times"])
        e["time"] = min(e["times"])
    table["measurement"] = {"interleaved_rounds": args.interleave, "time": "minimum over interleaved rounds",
                            "median": "median over the same rounds", "loadavg_before": load0,
                            "loadavg_after": os.getloadavg()}
    Path(args.table).write_text(json.dumps(table, indent=0) + "\n")
    print(f"{args.kernel}: {len(table['cache'])} configs ({len(ran)} ran), {args.interleave} interleaved rounds, best "
          f"{min(e['time'] for e in ran.values()):.4f} ms, load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f} -> {args.table}")


def _measure_rounds(args: argparse.Namespace, mod: Any, kwargs: dict[str, Any]) -> None:
    """``--rounds R``: R full brute-force sweeps (each config compiled, checked and timed ``--iterations``
    times per sweep), so every config is timed in R separate moments spread over the whole measurement;
    the table's ``time`` is the median of all its runs (``times`` keeps them, ``rounds`` says R). A config
    that failed in any sweep keeps the failure. Load average before and after goes into the header."""
    import tempfile

    import tracea

    load0 = os.getloadavg()
    merged: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            path = os.path.join(tmp, f"round{r}.json")
            mod.tune(tracea, **kwargs, strategy="brute_force", cache=path, tracea_cache=False,
                     iterations=args.iterations, quiet=True)
            table = _table(path)
            if merged is None:
                merged = table
                for e in merged["cache"].values():
                    e["times"] = list(e.get("times") or []) if isinstance(e.get("time"), (int, float)) else []
                continue
            for key, e in table["cache"].items():
                m = merged["cache"][key]
                if not isinstance(e.get("time"), (int, float)):
                    m["time"] = e["time"]
                elif isinstance(m.get("time"), (int, float)):
                    m["times"] = m["times"] + list(e.get("times") or [e["time"]])
            print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    assert merged is not None
    for e in merged["cache"].values():
        if isinstance(e.get("time"), (int, float)) and e["times"]:
            e["time"] = statistics.median(e["times"])
        e["rounds"] = args.rounds
    merged["measurement"] = {"rounds": args.rounds, "iterations": args.iterations, "time": "median of all runs",
                             "loadavg_before": load0, "loadavg_after": os.getloadavg()}
    Path(args.table).write_text(json.dumps(merged, indent=0) + "\n")
    ok = [e["time"] for e in merged["cache"].values() if isinstance(e.get("time"), (int, float))]
    print(f"{args.kernel}: {len(merged['cache'])} configs, {args.rounds} rounds ({len(ok)} ran), best {min(ok):.4f} ms, "
          f"load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f} -> {args.table}")


def _precompile_cuda(mod: Any, kwargs: dict[str, Any], jobs: int) -> None:
    """Fill CuPy's on-disk kernel cache from a process pool so the sequential measure hits it: the
    instance sources are built exactly as ``tune_kernel`` builds them (same defines, same grid)."""
    from concurrent.futures import ProcessPoolExecutor

    from tracea.usertune.session import Session
    from tracea.usertune.space import build_space, check_tune_params, compile_restrictions, from_config

    params, restrictions = mod.space()
    checked = check_tune_params(params)
    names = list(checked)
    bsn = ["block_size_x", "block_size_y", "block_size_z"]
    space = build_space(checked, compile_restrictions(restrictions, names), bsn, 1024)
    if mod.__name__ == "matmul_cuda":
        n = kwargs["n"]
        name, src, problem = "matmul_kernel", mod.KERNEL.replace("#define N 2048", f"#define N {n}"), (n, n)
    else:
        name, src, problem = "convolution_kernel", mod.source(kwargs["h"], kwargs["w"]), (kwargs["w"], kwargs["h"])
    grid_div = (["block_size_x", "tile_size_x"], ["block_size_y", "tile_size_y"], None)
    session = Session(runner=None, kernel_name=name, kernel_source=src, problem_size=problem, arguments=[], args=None,
                      grid_div=grid_div, block_size_names=bsn, lang="CUDA")
    jobs_list = []
    for c in space:
        launch = session.launch_for(from_config(c, names))
        jobs_list.append((launch.name, launch.source))
    with ProcessPoolExecutor(jobs) as pool:
        done = list(pool.map(_compile_one, jobs_list, chunksize=4))
    print(f"precompiled {sum(done)} of {len(done)} instances")


def _compile_one(job: tuple[str, str]) -> bool:
    import cupy as cp

    name, text = job
    try:
        cp.RawModule(code=text, options=("--std=c++11",), name_expressions=[name]).get_function(name)
        return True
    except Exception:  # noqa: BLE001 - failures are measured (and recorded) by the real run
        return False


# -- replay ------------------------------------------------------------------------------------------

def evals_to_target(trace: list[float], best: float, within: float, budget: int) -> int:
    """1-based index of the first evaluation within ``within`` of ``best``; budget + 1 if none."""
    for i, t in enumerate(trace[:budget]):
        if t <= best * (1 + within):
            return i + 1
    return budget + 1


class _Reached(Exception):
    """Stops a Tracea replay once the target is reached (the rest of the trace is not needed)."""


def tracea_trace(table: dict[str, Any], mod: Any, lang: str, budget: int, seed: int,
                 stop_below: float = -math.inf) -> list[float]:
    from tracea.usertune import strategies
    from tracea.usertune.space import build_space, check_tune_params, compile_restrictions

    params, restrictions = mod.space()
    checked = check_tune_params(params)
    names = list(checked)
    bsn = ["block_size_x", "block_size_y", "block_size_z"]
    space = build_space(checked, compile_restrictions(restrictions, names), bsn, 1024)
    entries = table["cache"]
    trace: list[float] = []

    def evaluate(p: dict[str, Any]) -> float:
        e = entries.get(",".join(str(p[n]) for n in names))
        t = e.get("time") if e else None
        t = float(t) if isinstance(t, (int, float)) else math.inf
        trace.append(t)
        if t <= stop_below:
            raise _Reached()
        return t

    name, opts = strategies.resolve(None, {"max_fevals": budget})
    try:
        strategies.run(name, opts, space, names, evaluate, seed)
    except _Reached:
        pass
    return trace


def kt_traces(args: argparse.Namespace, strategy: str, seeds: list[int], budget: int) -> list[list[float]]:
    """Run Kernel Tuner's simulation mode in a Python that has kernel_tuner (a subprocess)."""
    cmd = [args.kt_python, __file__, "kt-replay", "--kernel", args.kernel, "--table", args.table, "--strategy", strategy,
           "--budget", str(budget), "--seeds", ",".join(map(str, seeds))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"kt-replay failed: {out.stderr[-3000:]}")
    return [unique_trace(t) for t in json.loads(out.stdout.strip().splitlines()[-1])]


def unique_trace(trace: list[list[Any]]) -> list[float]:
    """Kernel Tuner's ``results`` list a config again when a strategy revisits it (its runner answers
    from its cache without compiling or timing again); such repeats are not counted as evaluations."""
    seen: set[str] = set()
    out = []
    for key, t in trace:
        if key not in seen:
            seen.add(key)
            out.append(float(t))
    return out


def kt_replay(args: argparse.Namespace) -> None:
    """(Runs under Kernel Tuner's Python.) Print JSON traces of ``--strategy`` for each seed."""
    import warnings

    import numpy as np
    import kernel_tuner

    warnings.filterwarnings("ignore")
    mod_name, kname, _, lang = KERNELS[args.kernel]
    mod = importlib.import_module(mod_name)
    params, restrictions = mod.space()
    if lang == "CUDA":  # the real runs skipped blocks over the device's 1024 threads; simulation must too
        restrictions = list(restrictions) + ["block_size_x * block_size_y <= 1024"]
    table = _table(args.table)
    ps = table["problem_size"]
    src = (mod.source(ps[1], ps[0]) if hasattr(mod, "source") else mod.KERNEL)
    nargs, nints = {"matmul_c": (4, 1), "vector_add_c": (4, 1), "conv2d_c": (5, 2), "stencil_c": (5, 2),
                    "matmul_cuda": (3, 0), "convolution_cuda": (3, 0), "stencil_cuda": (2, 0)}[args.kernel]
    dummy = [np.zeros(4, np.float32) for _ in range(nargs - nints)] + [np.int32(4)] * nints
    traces = []
    import contextlib
    import io
    import shutil
    import tempfile

    for seed in [int(s) for s in args.seeds.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "table.json")
            shutil.copy(args.table, cache)
            opts = {"max_fevals": args.budget} if args.strategy != "brute_force" else {}
            with contextlib.redirect_stdout(io.StringIO()):
                results, _ = kernel_tuner.tune_kernel(
                    kname, src, tuple(ps) if isinstance(ps, list) else ps, dummy, params, restrictions=restrictions or None,
                    lang=lang, strategy=args.strategy, strategy_options=opts or None, cache=cache,
                    simulation_mode=True, quiet=True, seed=seed, grid_div_x=["block_size_x"] if lang != "C" else None)
        names = list(params)
        traces.append([[",".join(str(r[n]) for n in names),
                        float(r["time"]) if isinstance(r.get("time"), (int, float)) else math.inf]
                       for r in results if r is not None])
    print(json.dumps(traces))


def replay_runs(args: argparse.Namespace, kernel: str, table_path: str) -> dict[str, Any]:
    """Evaluations-to-target of every strategy and seed on one table (see the module docstring)."""
    mod_name, _, _, lang = KERNELS[kernel]
    mod = importlib.import_module(mod_name)
    table = _table(table_path)
    times = [float(e["time"]) for e in table["cache"].values() if isinstance(e.get("time"), (int, float))]
    best = min(times)
    budget = args.budget or len(table["cache"])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    target = best * (1 + args.within)
    runs: dict[str, list[int]] = {}
    runs["tracea (default)"] = [evals_to_target(tracea_trace(table, mod, lang, budget, s, target), best, args.within,
                                                budget) for s in seeds]
    if args.kt_python:
        sub = argparse.Namespace(**{**vars(args), "kernel": kernel, "table": table_path})
        for strat in ("bayes_opt", "random_sample", "brute_force"):
            sd = seeds if strat != "brute_force" else [0]
            runs[f"kernel_tuner {strat}"] = [evals_to_target(t, best, args.within, budget)
                                             for t in kt_traces(sub, strat, sd, budget)]
    return {"kernel": kernel, "table": table_path, "device": table.get("device_name", ""), "best_ms": best,
            "configs": len(table["cache"]), "ran": len(times), "good": sum(1 for t in times if t <= target),
            "within": args.within, "budget": budget, "seeds": args.seeds, "runs": runs,
            "median": {k: statistics.median(v) for k, v in runs.items()}}


def _ratios(rep: dict[str, Any]) -> tuple[float | None, float | None]:
    """Tracea's median over Kernel Tuner's best of (bayes_opt, brute_force) and over its best strategy run."""
    med = rep["median"]
    kt_main = [med[k] for k in ("kernel_tuner bayes_opt", "kernel_tuner brute_force") if k in med]
    kt_all = [v for k, v in med.items() if k.startswith("kernel_tuner")]
    tr = med["tracea (default)"]
    return (tr / min(kt_main) if kt_main else None), (tr / min(kt_all) if kt_all else None)


def replay(args: argparse.Namespace) -> None:
    rep = replay_runs(args, args.kernel, args.table)
    budget = rep["budget"]
    print(f"{args.kernel}: {rep['configs']} configs in the table ({rep['ran']} ran), best {rep['best_ms']:.4f} ms, "
          f"{rep['good']} within {args.within:.0%}; budget {budget} evaluations, {args.seeds} seeds")
    med = rep["median"]
    kt_best = min((v for k, v in med.items() if k.startswith("kernel_tuner")), default=None)
    head = ("strategy", "median evals", "range", "not reached", "vs KT best")
    rows = []
    for k, v in rep["runs"].items():
        censored = sum(1 for x in v if x > budget)
        rows.append((k, f"{med[k]:g}" + (" (>budget)" if med[k] > budget else ""), f"{min(v)}-{max(v)}", str(censored),
                     f"{med[k] / kt_best:.2f}x" if kt_best else "-"))
    _print_rows([head] + rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _cell_of(rep: dict[str, Any]) -> Any:
    """A function printing one strategy's median of ``rep`` (with how many runs missed the budget)."""
    med, b = rep["median"], rep["budget"]

    def cell(k: str) -> str:
        if k not in med:
            return "-"
        v = rep["runs"][k]
        miss = sum(1 for x in v if x > b)
        return f"{med[k]:g}" + (f" ({miss} of {len(v)} >{b})" if miss else "")
    return cell


def summary(args: argparse.Namespace) -> None:
    """One table over several kernels: ``KERNEL=TABLE`` pairs, each replayed as ``replay`` does."""
    reps = []
    for pair in args.tables:
        kernel, _, path = pair.partition("=")
        if kernel not in KERNELS or not path:
            raise SystemExit(f"expected KERNEL=TABLE with KERNEL one of {', '.join(sorted(KERNELS))}: {pair!r}")
        reps.append(replay_runs(args, kernel, path))
        print(f"  {kernel}: done", file=sys.stderr, flush=True)
    head = ("kernel", "device", "space (ran)", "within 3%", "Tracea default", "KT bayes_opt", "KT random_sample",
            "KT brute_force", "Tracea / KT bayes_opt|default", "Tracea / best KT")
    rows = [head]
    for rep in reps:
        cell = _cell_of(rep)
        r_main, r_all = _ratios(rep)
        rows.append((rep["kernel"], rep["device"], f"{rep['configs']} ({rep['ran']})", str(rep["good"]),
                     cell("tracea (default)"), cell("kernel_tuner bayes_opt"), cell("kernel_tuner random_sample"),
                     cell("kernel_tuner brute_force"), f"{r_main:.2f}x" if r_main else "-", f"{r_all:.2f}x" if r_all else "-"))
    print(f"evaluations until within {args.within:.0%} of the exhaustive best: median over {args.seeds} seeds "
          f"(seeds {args.first_seed}..{args.first_seed + args.seeds - 1}); Kernel Tuner's repeats of a config are not counted (as its budget does not)")
    _print_rows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(reps, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    m.add_argument("--table", required=True)
    m.add_argument("--iterations", type=int, default=7)
    m.add_argument("--rounds", type=int, default=1, help="sweeps over the space; time = median of all runs")
    m.add_argument("--interleave", type=int, default=0,
                   help="C: after a verified sweep, time every config in this many rounds of random order; time = min")
    m.add_argument("--precompile", action="store_true", help="CUDA: compile every config in a process pool first")
    m.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("replay")
    r.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    r.add_argument("--table", required=True)
    r.add_argument("--seeds", type=int, default=10)
    r.add_argument("--first-seed", type=int, default=0, help="seeds first_seed .. first_seed + seeds - 1")
    r.add_argument("--within", type=float, default=0.03)
    r.add_argument("--budget", type=int, default=0, help="evaluations per run (default: the table's size)")
    r.add_argument("--kt-python", default=None, help="a Python with kernel_tuner installed (else Tracea only)")
    r.add_argument("--json", default=None)
    sm = sub.add_parser("summary", help="replay several tables and print one table")
    sm.add_argument("tables", nargs="+", help="KERNEL=TABLE pairs")
    sm.add_argument("--seeds", type=int, default=10)
    sm.add_argument("--first-seed", type=int, default=0, help="seeds first_seed .. first_seed + seeds - 1")
    sm.add_argument("--within", type=float, default=0.03)
    sm.add_argument("--budget", type=int, default=0)
    sm.add_argument("--kt-python", default=None)
    sm.add_argument("--json", default=None)
    k = sub.add_parser("kt-replay")
    k.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    k.add_argument("--table", required=True)
    k.add_argument("--strategy", required=True)
    k.add_argument("--budget", type=int, required=True)
    k.add_argument("--seeds", required=True)
    args = p.parse_args()
    {"measure": measure, "replay": replay, "summary": summary, "kt-replay": kt_replay}[args.cmd](args)


if __name__ == "__main__":
    main()
