"""Progress display while tuning: trial n/N and the best time so far.

tqdm when installed, else a plain ``\\r`` line; nothing when ``enabled`` is false or the stream is not
a terminal (logs and CI stay clean).
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
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=label, file=self.stream, leave=True,
                                 dynamic_ncols=True, unit="trial")
            except ImportError:
                self._bar = None

    def update(self, best_s: float, note: str = "", flops: float | None = None) -> None:
        self.n += 1
        if not self.enabled:
            return
        best = _fmt_time(best_s)
        if flops and math.isfinite(best_s) and best_s > 0:
            best += f" ({flops / best_s / 1e12:.3g} TFLOP/s)" if flops / best_s > 1e11 else \
                f" ({flops / best_s / 1e9:.3g} GFLOP/s)"
        if self._bar is not None:
            self._bar.set_postfix_str(f"best {best}{' ' + note if note else ''}", refresh=False)
            self._bar.update(1)
        else:
            self.stream.write(f"\r{self.label}: trial {self.n}/{self.total}  best {best}  {note:<24.24}")
            self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
