"""The runner: worker processes with a per-case timeout, crash and hang handling, and the tally.

Each of ``jobs`` threads drives one long-lived worker (``python -m tracea.fuzzing --worker``) and feeds
it one case at a time. A worker that dies or exceeds the timeout is a crash or a hang: the case is
replayed alone in a fresh worker to tell a reproducible failure from damage left by earlier cases
(the report then lists the cases that worker ran before), and a fresh worker takes over.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .cases import generate
from .oracle import CATEGORIES

#: how long a worker may take to import Tracea (and torch) before it is declared broken
STARTUP_TIMEOUT = 180.0
HISTORY = 50


@dataclass
class RunConfig:
    """What to run: cases ``start`` .. ``start + cases`` of ``seed`` (or until ``minutes`` pass)."""

    seed: int = 0
    cases: int | None = None
    start: int = 0
    minutes: float | None = None
    device: str = "cpu"
    jobs: int = 1
    timeout: float = 90.0
    known_issues: bool = False
    report: str | None = None
    isolate_cache: bool = True
    quiet: bool = False
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)


class WorkerDied(Exception):
    """The worker process exited (``returncode``) or stopped answering (``hung``)."""

    def __init__(self, returncode: int | None, hung: bool, events: list[dict[str, Any]]) -> None:
        super().__init__(f"worker {'hung' if hung else f'died ({returncode})'}")
        self.returncode = returncode
        self.hung = hung
        self.events = events


class Worker:
    """One worker process speaking the JSON-lines protocol of :func:`tracea.fuzzing.worker.serve`."""

    def __init__(self, cfg: RunConfig, logdir: str) -> None:
        self.cfg = cfg
        cmd = [cfg.python, "-m", "tracea.fuzzing", "--worker", "--device", cfg.device]
        if cfg.known_issues:
            cmd.append("--known-issues")
        self.log_path = tempfile.mktemp(prefix="worker-", suffix=".log", dir=logdir)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env={**os.environ, **cfg.env})
        self._buf = b""
        self.history: deque[int] = deque(maxlen=HISTORY)
        self._read(STARTUP_TIMEOUT, want="ready")

    def _lines(self, deadline: float) -> Iterator[dict[str, Any]]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._buf += chunk

    def _read(self, timeout: float, want: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        try:
            for msg in self._lines(deadline):
                if "event" in msg:
                    events.append(msg["event"])
                elif want in msg:
                    return msg, events
        except TimeoutError:
            self.kill()
            raise WorkerDied(None, True, events) from None
        except EOFError:
            raise WorkerDied(self.proc.wait(), False, events) from None
        raise WorkerDied(self.proc.wait(), False, events)  # pragma: no cover

    def run(self, seed: int, index: int) -> dict[str, Any]:
        """Run one case; raises :class:`WorkerDied` on a crash or a hang."""
        assert self.proc.stdin is not None
        self.history.append(index)
        try:
            self.proc.stdin.write((json.dumps({"seed": seed, "index": index}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self.proc.wait(), False, []) from None
        msg, _ = self._read(self.cfg.timeout, want="result")
        return msg["result"]

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        try:
            return Path(self.log_path).read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"quit": true}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class Tally:
    """Counts per backend, refusals by message, findings and known issues (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, Counter[str]] = {}
        self.variants: Counter[str] = Counter()
        self.expect: Counter[str] = Counter()
        self.refusals: dict[tuple[str, str], dict[str, Any]] = {}
        self.findings: list[dict[str, Any]] = []
        self.known: Counter[str] = Counter()
        self.harness: list[dict[str, Any]] = []
        self.closest: dict[str, tuple[float, str]] = {}  # backend/op/dtype -> (max err/bound, case)
        self.done = 0
        self.ran: list[tuple[int, str]] = []

    def add(self, rec: dict[str, Any]) -> None:
        with self.lock:
            self.done += 1
            if "harness_error" in rec:
                self.harness.append(rec)
                return
            backend = rec.get("backend", "none")
            row = self.rows.setdefault(backend, Counter())
            row["cases"] += 1
            self.expect[rec.get("expect", "?")] += 1
            self.ran.append((rec["index"], backend))
            for v in rec.get("variants", []):
                self.variants[v] += 1
            if rec.get("error") and not any(f["category"] == "nontracea" for f in rec["findings"]):
                key = (rec["expect"], normalize(rec["error"]))
                slot = self.refusals.setdefault(key, {"expect": key[0], "message": key[1], "count": 0,
                                                      "example": f"{rec['seed']}:{rec['index']}"})
                slot["count"] += 1
            if rec.get("err_ratio") is not None and not rec["findings"]:
                row["checked"] += 1
                key = f"{backend} {rec['op'] if rec['op'] != 'gemm' else 'matmul'} {rec.get('dtype')}"  # type: ignore[assignment]
                if rec["err_ratio"] > self.closest.get(key, (-1.0, ""))[0]:  # type: ignore[call-overload]
                    self.closest[key] = (rec["err_ratio"], f"{rec['seed']}:{rec['index']}")  # type: ignore[index]
            for k in rec.get("known", []):
                self.known[k] += 1
                row["known"] += 1
            for cat in {f["category"] for f in rec["findings"]}:
                row[cat] += 1
            for f in rec["findings"]:
                self.findings.append(finding_entry(rec, f))

    def crash(self, seed: int, index: int, category: str, message: str, backend: str, detail: str) -> None:
        with self.lock:
            self.done += 1
            row = self.rows.setdefault(backend, Counter())
            row["cases"] += 1
            row[category] += 1
            rec = {"seed": seed, "index": index, "backend": backend}
            self.findings.append(finding_entry(rec, {"category": category, "message": message, "detail": detail}))


def normalize(message: str) -> str:
    """A refusal message with numbers and array reprs folded, for counting by kind."""
    text = message.splitlines()[0] if message else ""
    text = re.sub(r"\(shape=\([^)]*\), dtype=[^)]*\)", "(...)", text)
    text = re.sub(r"got \[.*?(?=, expected)", "got [...]", text)  # Python lists
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", text)
    return text[:200]


def finding_entry(rec: dict[str, Any], f: dict[str, Any]) -> dict[str, Any]:
    """A report entry for one finding, with its reproducer."""
    seed, index = rec["seed"], rec["index"]
    case = generate(seed, index)
    return {"category": f["category"], "message": f["message"], "detail": f.get("detail", ""),
            "seed": seed, "index": index, "op": case.op, "expect": case.expect, "backend": rec.get("backend", "none"),
            "variants": rec.get("variants", []), "notes": case.notes,
            "reproducer": f"python -m tracea.fuzzing --replay {seed}:{index}",
            "call": case.call_text()}


def _backend_of(events: list[dict[str, Any]]) -> str:
    return events[-1]["backend"] if events else "none"


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run the cases of ``cfg`` and return the report (also written to ``cfg.report``)."""
    tally = Tally()
    t0 = time.monotonic()
    deadline = t0 + cfg.minutes * 60 if cfg.minutes else None
    stop = cfg.start + cfg.cases if cfg.cases is not None else None
    counter = itertools.count(cfg.start)
    lock = threading.Lock()
    tmp = tempfile.TemporaryDirectory(prefix="tracea-fuzz-")
    if cfg.isolate_cache and "TRACEA_CACHE_PATH" not in cfg.env:
        cfg.env["TRACEA_CACHE_PATH"] = os.path.join(tmp.name, "tuning_cache.json")

    def next_index() -> int | None:
        with lock:
            if deadline is not None and time.monotonic() > deadline:
                return None
            i = next(counter)
            return None if stop is not None and i >= stop else i

    def drive() -> None:
        worker: Worker | None = None
        try:
            while True:
                index = next_index()
                if index is None:
                    return
                if worker is None:
                    worker = Worker(cfg, tmp.name)
                try:
                    tally.add(worker.run(cfg.seed, index))
                except WorkerDied as died:
                    history = list(worker.history)[:-1]
                    tail = worker.log_tail()
                    worker.close()
                    worker = None
                    _died(cfg, tally, index, died, history, tail, tmp.name)
                _progress(cfg, tally, t0)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(max(1, cfg.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = build_report(cfg, tally, time.monotonic() - t0)
    tmp.cleanup()
    if cfg.report:
        write_report(report, cfg.report)
    return report


def _died(cfg: RunConfig, tally: Tally, index: int, died: WorkerDied, history: list[int], tail: str,
          logdir: str) -> None:
    """Record a crash or hang, after replaying the case alone in a fresh worker."""
    category = "hang" if died.hung else "crash"
    what = f"no answer within {cfg.timeout:g} s" if died.hung else f"worker died with exit status {died.returncode}"
    running = died.events[-1]["variant"] if died.events else "argument checks (no kernel started)"
    alone: str
    try:
        solo = Worker(cfg, logdir)
        try:
            solo.run(cfg.seed, index)
            alone = "not reproduced alone: earlier cases in the same worker may be to blame " \
                    f"(ran before it: {history[-10:]})"
        except WorkerDied as again:
            alone = "reproduced alone"
            died = again if again.events else died
            tail = solo.log_tail() or tail
        finally:
            solo.close()
    except WorkerDied:
        alone = "replay worker failed to start"
    backend = _backend_of(died.events)
    tally.crash(cfg.seed, index, category, f"{what} while running {running}; {alone}", backend,
                f"previous cases in that worker: {history}\n--- worker stderr ---\n{tail}")


def _progress(cfg: RunConfig, tally: Tally, t0: float) -> None:
    if cfg.quiet or tally.done % 200:
        return
    n = len(tally.findings)
    print(f"  {tally.done} cases, {n} findings, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


def build_report(cfg: RunConfig, tally: Tally, seconds: float) -> dict[str, Any]:
    import platform

    summary = {b: {c: int(row.get(c, 0)) for c in ("cases", "checked") + CATEGORIES + ("known",)}
               for b, row in sorted(tally.rows.items())}
    return {
        "tool": "tracea.fuzzing (ops)", "seed": cfg.seed, "start": cfg.start, "cases": tally.done,
        "device": cfg.device, "jobs": cfg.jobs, "timeout_s": cfg.timeout, "known_issues_tolerated": cfg.known_issues,
        "seconds": round(seconds, 1), "machine": {"platform": platform.platform(), "cpu": _cpu_model(),
                                                  "python": platform.python_version()},
        "summary": summary, "expect": dict(tally.expect), "variants": dict(tally.variants.most_common()),
        "refusals": sorted(tally.refusals.values(), key=lambda r: (-r["count"], r["message"])),
        "findings": tally.findings, "known": dict(tally.known), "harness_errors": tally.harness,
        "closest_to_bound": {k: {"err_over_bound": r, "case": c} for k, (r, c) in sorted(tally.closest.items())},
        "ran": tally.ran,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def write_report(report: dict[str, Any], path: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=1, default=str))


COLUMNS = (("cases", "cases"), ("crash", "crashes"), ("hang", "hangs"), ("wrong", "wrong results"),
           ("nontracea", "non-Tracea exceptions"), ("mutated", "mutated inputs"),
           ("refused_valid", "refused-valid"), ("known", "known"))


def summary_table(report: dict[str, Any]) -> str:
    """The per-backend table: cases / crashes / hangs / wrong results / non-Tracea exceptions /
    mutated inputs / refused-valid / known (tolerated known issues)."""
    rows = [("backend",) + tuple(title for _, title in COLUMNS)]
    total: Counter[str] = Counter()
    for backend, row in report["summary"].items():
        rows.append((backend,) + tuple(str(row.get(k, 0)) for k, _ in COLUMNS))
        total.update(row)
    rows.append(("total",) + tuple(str(total.get(k, 0)) for k, _ in COLUMNS))
    from ..cli.table import aligned

    return "\n".join(aligned(rows, right=range(1, len(rows[0])), rules=(1, len(rows) - 1)))
