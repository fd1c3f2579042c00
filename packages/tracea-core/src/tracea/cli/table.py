"""Plain-text tables for the CLI (no dependencies): aligned columns, a rule under the header, long
cells wrapped at a width limit."""

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


def section(title: str) -> str:
    return f"\n{title}\n" + "=" * len(title)
