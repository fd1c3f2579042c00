"""Sample efficiency of Tracea's default strategy against Kernel Tuner's strategies, on user kernels.

Method: every config of a kernel's space is compiled, checked against the reference and timed once
(``measure``: ``tracea.tune_kernel(strategy="brute_force", cache=TABLE)``), which writes the table as a
Kernel Tuner cache file. Then strategies are *replayed* over that table, over ``--seeds`` seeds:

- Tracea's default (``tune_kernel``'s default strategy: the candidate-set GP sampler), driven through
  ``tracea.usertune.strategies`` with the same space object ``tune_kernel`` builds;
- Kernel Tuner's ``bayes_opt``, ``random_sample`` and its default ``brute_force``, run by Kernel Tuner
  itself in its simulation mode on the same cache file (``kt-replay``, executed with a Python that has
  ``kernel_tuner`` installed: ``--kt-python``).

For each run we count the evaluations until the best time so far is within ``--within`` (3 %) of the
exhaustive best; failed configs (compile errors, too many resources) count as evaluations. A run that
never gets there within the budget counts as ``budget + 1`` and is marked with ``>``. The table shows
medians over seeds and Tracea's ratio to Kernel Tuner's best strategy.

    python benchmarks/tuner/kt_sample_efficiency.py measure --kernel matmul_c --table t.json
    python benchmarks/tuner/kt_sample_efficiency.py replay --kernel matmul_c --table t.json --kt-python /tmp/ktvenv/bin/python
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

KERNELS = {  # module, kernel name, problem arguments for measure, lang, block size limit
    "matmul_c": ("matmul_c", "matmul", {"n": 384}, "C"),
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
    results, env = mod.tune(tracea, **kwargs, strategy="brute_force", cache=args.table, tracea_cache=False,
                            iterations=args.iterations, quiet=True)
    ok = [r for r in results if "__error__" not in r]
    print(f"{args.kernel}: {len(results)} configs measured on {env['device_name']} ({len(ok)} ran), "
          f"best {min(r['time'] for r in ok):.4f} ms -> {args.table}")


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
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    nargs = {"matmul_c": 4, "vector_add_c": 4, "matmul_cuda": 3, "convolution_cuda": 3, "stencil_cuda": 2}[args.kernel]
    dummy = [np.zeros(4, np.float32) for _ in range(nargs)]
    if lang == "C":
        dummy[-1] = np.int32(4)
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
        traces.append([float(r["time"]) if isinstance(r.get("time"), (int, float)) else math.inf
                       for r in results if r is not None])
    print(json.dumps(traces))


def replay(args: argparse.Namespace) -> None:
    mod_name, _, _, lang = KERNELS[args.kernel]
    mod = importlib.import_module(mod_name)
    table = _table(args.table)
    times = [float(e["time"]) for e in table["cache"].values() if isinstance(e.get("time"), (int, float))]
    best = min(times)
    n_all = len(table["cache"])
    good = sum(1 for t in times if t <= best * (1 + args.within))
    budget = args.budget or n_all
    seeds = list(range(args.seeds))
    rows = []
    runs: dict[str, list[int]] = {}
    target = best * (1 + args.within)
    runs["tracea (default)"] = [evals_to_target(tracea_trace(table, mod, lang, budget, s, target), best, args.within,
                                                budget) for s in seeds]
    if args.kt_python:
        for strat in ("bayes_opt", "random_sample", "brute_force"):
            sd = seeds if strat != "brute_force" else [0]
            traces = kt_traces(args, strat, sd, budget)
            runs[f"kernel_tuner {strat}"] = [evals_to_target(t, best, args.within, budget) for t in traces]
    print(f"{args.kernel}: {n_all} configs in the table ({len(times)} ran), best {best:.4f} ms, {good} within "
          f"{args.within:.0%}; budget {budget} evaluations, {args.seeds} seeds")
    med = {k: statistics.median(v) for k, v in runs.items()}
    kt_best = min((v for k, v in med.items() if k.startswith("kernel_tuner")), default=None)
    for k, v in runs.items():
        censored = sum(1 for x in v if x > budget)
        rows.append((k, f"{med[k]:g}" + (" (>budget)" if med[k] > budget else ""),
                     f"{min(v)}-{max(v)}", str(censored),
                     f"{med[k] / kt_best:.2f}x" if kt_best else "-"))
    widths = [max(len(r[i]) for r in rows + [("strategy", "median evals", "range", "not reached", "vs KT best")])
              for i in range(5)]
    for r in [("strategy", "median evals", "range", "not reached", "vs KT best")] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    if args.json:
        Path(args.json).write_text(json.dumps({"kernel": args.kernel, "best_ms": best, "configs": n_all,
                                                "within": args.within, "budget": budget, "runs": runs}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    m.add_argument("--table", required=True)
    m.add_argument("--iterations", type=int, default=7)
    m.add_argument("--precompile", action="store_true", help="CUDA: compile every config in a process pool first")
    m.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("replay")
    r.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    r.add_argument("--table", required=True)
    r.add_argument("--seeds", type=int, default=10)
    r.add_argument("--within", type=float, default=0.03)
    r.add_argument("--budget", type=int, default=0, help="evaluations per run (default: the table's size)")
    r.add_argument("--kt-python", default=None, help="a Python with kernel_tuner installed (else Tracea only)")
    r.add_argument("--json", default=None)
    k = sub.add_parser("kt-replay")
    k.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    k.add_argument("--table", required=True)
    k.add_argument("--strategy", required=True)
    k.add_argument("--budget", type=int, required=True)
    k.add_argument("--seeds", required=True)
    args = p.parse_args()
    {"measure": measure, "replay": replay, "kt-replay": kt_replay}[args.cmd](args)


if __name__ == "__main__":
    main()
