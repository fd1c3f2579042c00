"""Tuning-cache fuzzer: hostile cache files and entries against dispatch, the CLI and ``put``.

``python -m tracea.testing.fuzz_cache --cases 1000`` (or ``--minutes 10``) generates seeded cases
(:mod:`.cases`: truncations, byte flips, bad JSON, wrong types at every field of the file, of an
entry and of its config, huge and non-finite numbers, deep nesting, huge strings, duplicate keys,
FIFOs, directories, symbolic links, unreadable and oversized files, and entries whose fingerprint
matches this machine carrying hostile configs), runs them in child processes (:mod:`.runner`, so a
crash or a hang is a finding attributed to its case), checks each against :mod:`.oracle`, then runs
the concurrency scenarios (:mod:`.concurrency`) and prints the summary (:mod:`.report`).

See docs/fuzzing.md.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .cases import cases as case_stream
from .report import ROWS, CaseResult, Summary
from .runner import run_batch

__all__ = ["run", "Summary", "CaseResult", "ROWS", "case_stream"]


def run(cases: int | None = None, minutes: float | None = None, seed: int = 0, report_path: str | None = None, *,
        batch: int = 40, jobs: int = 1, case_timeout: float = 60.0, concurrency: bool = True,
        progress: Any = None) -> Summary:
    """Fuzz the tuning cache with ``cases`` cases and/or for ``minutes`` (whichever ends first; with
    neither, 1000 cases) from ``seed``; write the JSON report to ``report_path`` when given.

    :param batch: cases per child process. :param jobs: child processes at once.
    :param case_timeout: seconds after which a case counts as hung.
    :param concurrency: also run the multi-process scenarios (clean and with a vandal).
    :param progress: a callable taking the summary so far, called after every batch.
    :returns: the :class:`Summary` (``summary.ok`` is True when nothing was found).
    """
    if cases is None and minutes is None:
        cases = 1000
    start = time.monotonic()
    deadline = start + minutes * 60 if minutes is not None else None
    summary = Summary(seed)
    stream = case_stream(seed)
    if cases is not None:
        stream = itertools.islice(stream, cases)

    def batches() -> Any:
        while deadline is None or time.monotonic() < deadline:
            chunk = list(itertools.islice(stream, batch))
            if not chunk:
                return
            yield chunk

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        pending = []
        for chunk in batches():
            pending.append(pool.submit(run_batch, chunk, case_timeout=case_timeout))
            while len(pending) >= max(1, jobs):
                for r in pending.pop(0).result():
                    summary.add(r)
                summary.elapsed_s = time.monotonic() - start
                if progress:
                    progress(summary)
        for fut in pending:
            for r in fut.result():
                summary.add(r)
    if concurrency:
        from . import concurrency as conc

        with tempfile.TemporaryDirectory(prefix="tcf-conc") as work:
            clean = conc.run(work + "/clean")
            vandal = conc.run(work + "/vandal", vandal=True)
        summary.concurrency = {"processes": clean["processes"], "threads": clean["threads"],
                               "entries": clean["entries"] + vandal["entries"],
                               "vandal_acts": vandal["vandal_acts"], "asides": vandal["asides"],
                               "problems": [f"clean: {p}" for p in clean["problems"]] +
                                           [f"vandal: {p}" for p in vandal["problems"]]}
    summary.elapsed_s = time.monotonic() - start
    if report_path:
        summary.write(report_path)
    return summary
