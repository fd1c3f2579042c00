"""Concurrency check of the tuning cache: several processes (each with several threads) putting
entries, tuning and dispatching ops on one cache file at once.

Clean run: every entry a ``put`` reported written must be in the final file, the file must be a
valid cache, no temporary file may be left, no process may fail. Vandal run: a thread of the parent
truncates or overwrites the file now and then; entries may then be lost (the vandal destroyed
them), but nothing may crash or hang, damage must be set aside (never a valid file: that would be a
good file another process wrote moved aside by mistake), and the final file must be a valid cache.

Worker: ``python -m tracea.testing.fuzz_cache.concurrency worker PATH WHO ITERATIONS THREADS TUNE``.
"""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any


def run(workdir: str, *, processes: int = 3, threads: int = 2, iterations: int = 15, vandal: bool = False,
        timeout_s: float = 300.0) -> dict[str, Any]:
    """Run one concurrency scenario in ``workdir``; returns counts and a list of ``problems``."""
    path = os.path.join(workdir, "shared", "tuning_cache.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cmd = [sys.executable, "-m", "tracea.testing.fuzz_cache.concurrency"]
    procs = [subprocess.Popen(cmd + ["worker", path, str(w), str(iterations), str(threads), str(int(w == 0))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(processes)]
    stop = threading.Event()
    acts: list[str] = []
    vandal_thread = threading.Thread(target=_vandalise, args=(path, stop, acts), daemon=True) if vandal else None
    if vandal_thread:
        vandal_thread.start()
    problems: list[str] = []
    written: list[str] = []
    deadline = time.monotonic() + timeout_s
    for w, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            problems.append(f"worker {w} hung (killed after {timeout_s:.0f} s)")
            continue
        if p.returncode != 0:
            problems.append(f"worker {w} failed (exit {p.returncode}): {err[-600:]}")
            continue
        report = json.loads(out.strip().splitlines()[-1])
        written += report["written"]
        problems += [f"worker {w}: {e}" for e in report["errors"]]
    stop.set()
    if vandal_thread:
        vandal_thread.join()
        _settle(path)  # a reader after the vandal's last act sets the damage aside
    final = _entries(path) if os.path.exists(path) or not vandal else {}
    if final is None:
        problems.append("the final cache file is not a valid cache")
        final = {}
    if glob.glob(path + ".tmp-*"):
        problems.append(f"temporary files left: {glob.glob(path + '.tmp-*')[:3]}")
    asides = glob.glob(path + ".corrupt-*")
    if vandal:  # (damage a writer replaces before anyone reads it leaves nothing to set aside)
        if acts and not asides:
            problems.append(f"the vandal damaged the file {len(acts)} times but nothing was set aside")
        valid = [a for a in asides if _entries(a) is not None]
        if valid:  # every vandal act leaves invalid JSON: a valid file set aside was a good one
            problems.append(f"{len(valid)} valid cache files were set aside, e.g. {valid[0]}")
    else:
        lost = [k for k in written if k not in final]
        if lost:
            problems.append(f"{len(lost)} of {len(written)} written entries lost, e.g. {lost[0][:100]}")
        if asides:
            problems.append(f"{len(asides)} files set aside although nothing was damaged")
    return {"processes": processes, "threads": threads, "entries": len(written), "vandal_acts": len(acts),
            "asides": len(asides), "problems": problems}


def _settle(path: str) -> None:
    import warnings

    from tracea.tuning.cache import TuningCache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        len(TuningCache(path))


def _entries(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        return doc["entries"] if doc.get("format") == "tracea-tuning-cache" else None
    except Exception:  # noqa: BLE001
        return None


def _vandalise(path: str, stop: threading.Event, acts: list[str]) -> None:
    rng = random.Random(0)
    while not stop.wait(rng.uniform(0.2, 0.6)):
        try:
            with open(path, "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                if size < 10:
                    continue
                if rng.random() < 0.5:
                    f.truncate(size // 2)
                    acts.append("truncate")
                else:
                    f.seek(rng.randrange(size))
                    f.write(b'\x00{"]')
                    acts.append("overwrite")
        except OSError:
            continue


def worker(path: str, who: int, iterations: int, threads: int, tune: bool) -> dict[str, Any]:
    """One process: ``threads`` threads putting entries and dispatching; thread 0 of a ``tune``
    worker also tunes a small GEMM. Returns the keys written and any error seen."""
    import numpy as np

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir import GemmOp
    from tracea.tuning.cache import TuningCache, set_cache

    cache = TuningCache(path)
    set_cache(cache)
    doctor = get_doctor()
    profile = doctor.profile_for("cpu")
    written: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    rng = np.random.default_rng(who)
    a, b = rng.standard_normal((24, 16)).astype(np.float32), rng.standard_normal((16, 20)).astype(np.float32)
    ref = a.astype(np.float64) @ b

    def body(t: int) -> None:
        try:
            if tune and t == 0:
                from tracea.tuning.autotuner import AutoTuner

                tuner = AutoTuner(trials=2, seed=who, sampler="random", progress=False, warmup=0, min_repeats=1,
                                  max_repeats=1, budget_s=0.0, cache=cache)
                res = tuner.tune(GemmOp(16 + who, 16, 16), "cpu")
                with lock:
                    written.extend(v.entry.key for v in res.variants.values() if v.entry is not None)
            for i in range(iterations):
                op = GemmOp(8 + who, 8 + t, 8 + i)
                c = doctor.decide(op, "cpu", use_cache=False).candidates[0]
                e = cache.make_entry(op, c.variant, profile, c.config, {"median_s": 1e-4 * (i + 1)}, trials=1)
                if cache.put(e):
                    with lock:
                        written.append(e.key)
                if i % 3 == 0:
                    out = tracea.ops.matmul(a, b)
                    if np.linalg.norm(out - ref) / np.linalg.norm(ref) > 1e-4:
                        raise AssertionError("wrong matmul result")
                    cache.lookup(op, c.variant, profile)
        except Exception as exc:  # noqa: BLE001
            with lock:
                errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return {"written": written, "errors": errors}


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        import warnings

        warnings.simplefilter("ignore")
        p, who, its, ths, tune = sys.argv[2], *map(int, sys.argv[3:7])
        print(json.dumps(worker(p, who, its, ths, bool(tune))))
        sys.exit(0)
    sys.exit("usage: python -m tracea.testing.fuzz_cache.concurrency worker PATH WHO ITERATIONS THREADS TUNE")
