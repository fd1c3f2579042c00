"""Replays under a memory checker: each sampled case runs alone in its own process under
``compute-sanitizer --tool memcheck --error-exitcode 99`` (``SANITIZER_CMD``), as
``python -m tracea.fuzzing --replay SEED:INDEX --device DEVICE``. Exit status 99 is a sanitizer
error; another non-zero status is a finding of the replay itself (or a crash) and is counted apart.

``sanitizer_cmd`` can be any command prefix (tests use ``env`` or a shell that exits 99). ``jobs``
replays run at once (each is its own process and CUDA context; memcheck is mostly host-bound, so a
many-core GPU machine gains nearly ``jobs``-fold).
"""

from __future__ import annotations

import random
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SANITIZER_CMD = "compute-sanitizer --tool memcheck --error-exitcode 99"
SANITIZER_EXIT = 99


def sample(seed: int, ran: list[tuple[int, str]], k: int, device: str) -> list[int]:
    """``k`` case indices to replay: cases that ran on a kernel of ``device``'s backend first (those
    that reached no kernel teach a memory checker nothing), then any others."""
    rng = random.Random(f"tracea-fuzz-sanitize:{seed}")
    kernel_backends = {"cuda"} if device == "cuda" else {"cpu", "reference"}
    first = [i for i, b in ran if b in kernel_backends]
    rest = [i for i, b in ran if b not in kernel_backends]
    rng.shuffle(first)
    rng.shuffle(rest)
    return sorted((first + rest)[:k])


def _replay(seed: int, index: int, device: str, sanitizer_cmd: str, timeout: float, python: str,
            env: dict[str, str] | None) -> tuple[int | None, str, list[str], float]:
    argv = shlex.split(sanitizer_cmd) + [python, "-m", "tracea.fuzzing", "--replay", f"{seed}:{index}",
                                         "--device", device]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
        rc: int | None = proc.returncode
        text = (proc.stdout or "") + (proc.stderr or "")
    except subprocess.TimeoutExpired as exc:
        out_b, err_b = exc.stdout or b"", exc.stderr or b""  # bytes even with text=True
        rc, text = None, (f"timed out after {timeout:g} s\n"
                          + (out_b.decode(errors="replace") if isinstance(out_b, bytes) else out_b)
                          + (err_b.decode(errors="replace") if isinstance(err_b, bytes) else err_b))
    except FileNotFoundError as exc:
        rc, text = 127, f"cannot run {argv[0]!r}: {exc}"
    return rc, text, argv, time.monotonic() - t0


def run(seed: int, indices: list[int], device: str, sanitizer_cmd: str = SANITIZER_CMD, timeout: float = 600.0,
        python: str = sys.executable, env: dict[str, str] | None = None, quiet: bool = False,
        jobs: int = 1) -> dict[str, Any]:
    """Replay ``indices`` each under ``sanitizer_cmd`` (``jobs`` at a time); counts and the failing
    cases (in index order) with output tails."""
    out: dict[str, Any] = {"command": sanitizer_cmd, "cases": 0, "sanitizer_errors": 0, "other_failures": 0,
                           "timeouts": 0, "failures": []}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda i: (i, *_replay(seed, i, device, sanitizer_cmd, timeout, python, env)),
                                indices))
    for index, rc, text, argv, seconds in results:
        out["cases"] += 1
        if rc == 0:
            continue
        kind = "timeout" if rc is None else ("sanitizer" if rc == SANITIZER_EXIT else "other")
        out["timeouts" if rc is None else ("sanitizer_errors" if rc == SANITIZER_EXIT else "other_failures")] += 1
        out["failures"].append({"index": index, "seed": seed, "kind": kind, "returncode": rc,
                                "seconds": round(seconds, 1), "command": shlex.join(argv),
                                "output_tail": text[-4000:]})
        if not quiet:
            print(f"  sanitizer: case {seed}:{index}: {kind} (exit {rc})", file=sys.stderr, flush=True)
    return out
