"""The interference check of the CPU benchmarks (issue 17): Tracea's call and its anchor, each timed alone
(back to back) and with other libraries' calls (NumPy's OpenBLAS, torch) made before every timed call, as
a program mixing them does; used by ``bench_user_cpu.py --only interference`` (fp32 vs NumPy) and
``bench_amx.py --only interference`` (bf16 vs torch)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def block(fn: Callable[[], Any], before: list[Callable[[], Any]], reps: int = 15) -> float:
    """Median seconds of ``fn`` over ``reps`` calls, each after the calls in ``before`` (untimed)."""
    fn()
    ts = []
    for _ in range(reps):
        for o in before:
            o()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


#: seconds of quiet before each "alone" block: the pools the previous block's calls woke (OpenBLAS's workers
#: spin 2^28 TSC cycles, ~0.1 s, after a call; OpenMP workers up to their spin count) go idle first, so an
#: "alone" block is not timed inside the others' spin window (on a 16-core host it was: "alone" calls of 8 ms
#: against 2.2 ms in the first round)
QUIET_S = 0.5


def check(ours: Callable[[], Any], theirs: Callable[[], Any], others: list[Callable[[], Any]], anchor: str,
          runs: int = 5, quiet_s: float = QUIET_S) -> dict:
    """``runs`` rounds of four blocks (ours and the anchor alone, each after ``quiet_s`` seconds of quiet,
    then each with ``others`` first); prints each round's times, the ratios (anchor time / ours) alone and
    interleaved and the median of |interleaved / alone - 1| (target: within 10%); returns them."""
    # one untimed pair of blocks first: the first parallel calls of a fresh process run 10-25 ms instead of
    # ~1 ms on the 2-core VM, and the 16-core host's first block showed 0.47x against 1.16-1.24x after
    block(theirs, [])
    block(ours, [])
    alone, mixed, times = [], [], []
    for _ in range(runs):
        time.sleep(quiet_s)
        ta = block(ours, [])
        time.sleep(quiet_s)
        na = block(theirs, [])
        tm, nm = block(ours, others), block(theirs, others)
        alone.append(na / ta)
        mixed.append(nm / tm)
        times.append((ta, tm, na, nm))
        print(f"  tracea alone {ta * 1e3:6.1f} ms  interleaved {tm * 1e3:6.1f} ms   {anchor} alone {na * 1e3:6.1f} ms  "
              f"interleaved {nm * 1e3:6.1f} ms", flush=True)
    dev = statistics.median(abs(m / a - 1) for a, m in zip(alone, mixed))
    print("  ratio alone       " + " ".join(f"{r:5.2f}x" for r in alone))
    print("  ratio interleaved " + " ".join(f"{r:5.2f}x" for r in mixed))
    print(f"  median |interleaved / alone - 1| = {100 * dev:.1f}% (target <= 10%)", flush=True)
    return dict(alone=alone, interleaved=mixed, times_s=times, median_deviation=dev)
