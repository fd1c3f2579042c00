"""Running batches of cases in child processes, attributing crashes and hangs to single cases.

A child (:mod:`.child`) announces each case before running it, so when it dies or stops answering
the parent knows which case did it: that case is recorded as a ``crash`` (with the exit status and
the end of stderr) or a ``hang`` (after ``case_timeout`` seconds), re-run alone in a fresh child to
see whether it reproduces, and the rest of the batch continues in another child.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from .report import MARK, CaseResult

STARTUP_S = 600.0  # importing Tracea and compiling the kernels the first time


def run_batch(recipes: list[dict[str, Any]], *, case_timeout: float = 60.0, confirm: bool = True) -> list[CaseResult]:
    """Run ``recipes`` in as few child processes as crashes allow; one result per recipe, in order."""
    results: dict[int, CaseResult] = {}
    todo = list(recipes)
    while todo:
        done, bad = _one_child(todo, case_timeout)
        results.update({r.id: r for r in done})
        if bad is None:
            for r in todo:  # the child ended early without a culprit: report what never ran
                results.setdefault(r["id"], CaseResult(r["id"], r.get("kind", ""), "harness_error",
                                                       detail="the child exited before running this case",
                                                       recipe=r))
            break
        results[bad.id] = bad
        if confirm and len(todo) > 1:
            again, culprit = _one_child([bad.recipe], case_timeout)
            bad.detail += " | alone: " + (f"{culprit.outcome} again" if culprit else "passed (not reproduced)")
        todo = [r for r in todo if r["id"] not in results]
    return [results[r["id"]] for r in recipes]


def _one_child(recipes: list[dict[str, Any]], case_timeout: float) -> tuple[list[CaseResult], CaseResult | None]:
    """Run recipes in one child until it finishes or one case crashes or hangs; returns the finished
    cases and that case (None when the child went through, or failed outside any case)."""
    by_id = {r["id"]: r for r in recipes}
    with tempfile.TemporaryDirectory(prefix="tcf") as work:
        spec = os.path.join(work, "recipes.json")
        with open(spec, "w") as f:
            json.dump(recipes, f)
        err_path = os.path.join(work, "stderr.txt")
        with open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tracea.testing.fuzz_cache.child", spec, work],
                                    stdout=subprocess.PIPE, stderr=err, text=True, errors="replace",
                                    start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        done: list[CaseResult] = []
        current: int | None = None
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                tail = _tail(err_path)
                if current is None:
                    sys.stderr.write(f"fuzz child gave no answer outside a case: {tail}\n")
                    return done, None
                r = by_id[current]
                return done, CaseResult(current, r.get("kind", ""), "hang",
                                        detail=f"no answer within {case_timeout:.0f} s; stderr: {tail}", recipe=r)
            if line is None:  # the child's stdout closed: it exited
                rc = proc.wait()
                if current is not None:
                    r = by_id[current]
                    why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
                    return done, CaseResult(current, r.get("kind", ""), "crash",
                                            detail=f"{why}; stderr: {_tail(err_path)}", recipe=r)
                if rc != 0 and len(done) < len(recipes):
                    sys.stderr.write(f"fuzz child failed outside a case (exit {rc}): {_tail(err_path)}\n")
                return done, None
            msg = json.loads(line)
            if "start" in msg:
                current = msg["start"]
                deadline = time.monotonic() + case_timeout
            elif "end" in msg:
                r = by_id[msg["end"]]
                outcome = "harness_error" if msg.get("harness_error") else "ok"
                done.append(CaseResult(msg["end"], r.get("kind", ""), outcome, msg.get("findings", []),
                                       msg.get("harness_error", ""), r))
                current = None
                deadline = time.monotonic() + case_timeout


def _pump(stream: Any, lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        if line.startswith(MARK):
            lines.put(line[len(MARK):])
    lines.put(None)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", "replace")
    except OSError:
        return ""
