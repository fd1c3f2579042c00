"""A short ops-fuzzer run: fixed seed, a few hundred cases over every op, array kind and layout, in
worker processes. Any finding fails the test; its message carries the reproducer
(``python -m tracea.fuzzing --replay SEED:INDEX``). The long runs are ``python3 dev.py fuzz``."""

from __future__ import annotations

import os
import sys

from tracea.fuzzing import runner

SEED = 20251
CASES = 300
# The defects listed in tracea/fuzzing/known_issues.py are fixed: none is tolerated.
TOLERATE_KNOWN_ISSUES = False


def test_ops_fuzz_short_run_has_no_findings():
    cfg = runner.RunConfig(seed=SEED, cases=CASES, jobs=2, quiet=True, known_issues=TOLERATE_KNOWN_ISSUES,
                           env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    report = runner.run(cfg)
    assert report["cases"] == CASES
    problems = [f"[{f['category']}] {f['op']} on {f['backend']}: {f['message']}\n  {f['reproducer']}\n  "
                + f["call"].replace("\n", "\n  ") for f in report["findings"]]
    problems += [f"harness error {h['seed']}:{h['index']}: {h['harness_error']}" for h in report["harness_errors"]]
    assert not problems, runner.summary_table(report) + "\n" + "\n".join(problems)
    assert len(report["summary"]) >= 3, report["summary"]  # kernels, fallbacks and argument errors all reached
