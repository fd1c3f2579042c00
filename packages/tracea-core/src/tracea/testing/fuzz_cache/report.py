"""Results of a cache-fuzzing run: per-case outcomes, the summary counts and the printed table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: prefix of the child's protocol lines on stdout (anything else there is ignored).
MARK = "@@FUZZ@@ "

#: summary rows: (finding or outcome, label), in print order. The first eight are the acceptance
#: criteria (all must be 0); the rest are further checks.
ROWS = [("crash", "crashes (signal or abnormal exit)"), ("hang", "hangs (case timeout)"),
        ("wrong_result", "wrong results"), ("blocked_dispatch", "blocked dispatches (TraceaError from an op)"),
        ("non_tracea_exception", "non-Tracea exceptions"), ("lost_good", "lost good entries"),
        ("not_kept_aside", "bad files not kept aside"), ("cli_error", "CLI errors (unexpected exit code)"),
        ("put_failed", "failed puts on writable paths"), ("good_ignored", "good entries not used by dispatch"),
        ("harness_error", "fuzzer errors (not Tracea's)")]


@dataclass
class CaseResult:
    """One case: its recipe's ``id`` and ``kind``, ``outcome`` (``ok``, ``crash``, ``hang``,
    ``harness_error``), the findings of a completed case, and ``detail`` (stderr tail, exit status;
    whether a crash reproduced alone)."""

    id: int
    kind: str
    outcome: str = "ok"
    findings: list[dict[str, str]] = field(default_factory=list)
    detail: str = ""
    recipe: dict[str, Any] = field(default_factory=dict)

    def types(self) -> set[str]:
        out = {f["type"] for f in self.findings}
        if self.outcome != "ok":
            out.add(self.outcome)
        return out


@dataclass
class Summary:
    """What a run found: ``counts`` of cases per finding type (a case counts once per type),
    ``cases`` run, ``elapsed_s``, the ``seed``, ``failed`` cases in full, and ``concurrency`` results."""

    seed: int
    cases: int = 0
    elapsed_s: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k, _ in ROWS})
    failed: list[CaseResult] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    concurrency: dict[str, Any] = field(default_factory=dict)

    def add(self, result: CaseResult) -> None:
        self.cases += 1
        family = result.kind.split("/", 1)[0]
        self.kinds[family] = self.kinds.get(family, 0) + 1
        types = result.types()
        for t in types:
            self.counts[t] = self.counts.get(t, 0) + 1
        if types:
            self.failed.append(result)

    @property
    def ok(self) -> bool:
        """True when no case had any finding and the concurrency run lost nothing."""
        return not self.failed and not self.concurrency.get("problems")

    def table(self) -> str:
        """The summary as text: cases, each finding type's count, the concurrency run."""
        lines = [f"tuning-cache fuzz: seed {self.seed}, {self.cases} cases in {self.elapsed_s:.0f} s",
                 "  families: " + ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items()))]
        width = max(len(label) for _, label in ROWS)
        lines.append(f"  {'cases':<{width}}  {self.cases}")
        lines += [f"  {label:<{width}}  {self.counts.get(key, 0)}" for key, label in ROWS]
        if self.concurrency:
            c = self.concurrency
            lines.append(f"  concurrency: {c.get('processes', 0)} processes x {c.get('threads', 0)} threads, "
                         f"{c.get('entries', 0)} entries put, {len(c.get('problems', []))} problems")
            lines += [f"    {p}" for p in c.get("problems", [])[:10]]
        for r in self.failed[:20]:
            what = ", ".join(sorted(r.types()))
            first = r.findings[0]["detail"] if r.findings else r.detail
            lines.append(f"  case {r.id} [{r.kind}] {what}: {first[:200]}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "cases": self.cases, "elapsed_s": self.elapsed_s, "counts": self.counts,
                "families": self.kinds, "concurrency": self.concurrency, "failed": [asdict(r) for r in self.failed]}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1, default=str)
