"""Progress display while tuning: a tqdm bar with trial n/N and the best time so far.

Nothing is shown when ``enabled`` is false or the stream is not a terminal (logs and CI stay clean).
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO


def _fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"


class Progress:
    """``with Progress(total, label) as p: p.update(best_s, note)``."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(enabled) and bool(isatty())
        self.n = 0
        self._bar: Any = None
        if self.enabled:
            from tqdm import tqdm  # imported only when a bar is shown: importing the tuner stays light

            self._bar = tqdm(total=total, desc=label, file=self.stream, leave=True, dynamic_ncols=True, unit="trial")

    def update(self, best_s: float, note: str = "", flops: float | None = None) -> None:
        self.n += 1
        if self._bar is None:
            return
        best = _fmt_time(best_s)
        if flops and math.isfinite(best_s) and best_s > 0:
            best += f" ({flops / best_s / 1e12:.3g} TFLOP/s)" if flops / best_s > 1e11 else \
                f" ({flops / best_s / 1e9:.3g} GFLOP/s)"
        self._bar.set_postfix_str(f"best {best}{' ' + note if note else ''}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
