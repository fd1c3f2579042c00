"""Plain-text tables, the one renderer of every table Tracea prints (CLI, tuning reports, fuzz summaries,
tracea-torch's per-layer report): :func:`render` (a rule under the header, long cells wrapped to the
terminal) and :func:`aligned` (columns padded to their widest cell, no wrapping, for logs)."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any, Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, max_col: int = 60, indent: str = "  ") -> str:
    """Render ``rows`` under ``headers``; cells wider than ``max_col`` wrap onto continuation lines."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    ncol = len(headers)
    total = shutil.get_terminal_size((120, 20)).columns - len(indent)
    widths = [min(max_col, max(len(r[i]) for r in cells)) for i in range(ncol)]
    # Shrink the widest column until the table fits the terminal.
    while sum(widths) + 2 * (ncol - 1) > total and max(widths) > 12:
        widths[widths.index(max(widths))] -= 1
    lines = []
    for idx, row in enumerate(cells):
        wrapped = [textwrap.wrap(c, widths[i]) or [""] for i, c in enumerate(row)]
        for j in range(max(len(w) for w in wrapped)):
            parts = [(w[j] if j < len(w) else "").ljust(widths[i]) for i, w in enumerate(wrapped)]
            lines.append(indent + "  ".join(parts).rstrip())
        if idx == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def aligned(rows: Sequence[Sequence[Any]], *, right: Sequence[int] = (), indent: str = "",
            rules: Sequence[int] = ()) -> list[str]:
    """``rows`` (the first is usually the header) as lines of columns padded to their widest cell and
    separated by two spaces; columns whose index is in ``right`` are right-aligned; a rule of dashes
    spanning the table is inserted before each row index in ``rules``. Trailing blanks are stripped."""
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if not cells:
        return []
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = [indent + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in cells]
    rule = indent + "-" * max(len(line) - len(indent) for line in lines)
    for at in sorted(rules, reverse=True):
        lines.insert(at, rule)
    return lines


def section(title: str) -> str:
    return f"\n{title}\n" + "=" * len(title)
