"""A hash of the Python code a kernel variant comes from, so tuned configs and arbiter verdicts measured
on older code are not reused after the code changes.

A released package's files change only with its version (already part of every fingerprint); a
source checkout or an editable install changes under the same version number, and a config tuned, or a
verdict reached, on an older kernel would otherwise be served as if it measured the current one.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

#: files larger than this are not read (a package of generated data): their size and name stand in
MAX_FILE_BYTES = 4 << 20


@functools.lru_cache(maxsize=None)
def module_source_hash(module: str) -> str:
    """A short hash of the Python sources of ``module``'s top-level package (every ``.py`` file under
    it, by relative path and contents; for a plain module, its file), or ``""`` when there is nothing to
    read (an interactive ``__main__``, frozen or zipped code, an unreadable file). Worked out once per
    process and module name."""
    top = module.split(".", 1)[0]
    mod = sys.modules.get(top)
    if mod is None:
        return ""
    paths = getattr(mod, "__path__", None)
    try:
        if paths:
            roots = [Path(p) for p in paths]
            files = sorted((f.relative_to(root).as_posix(), f) for root in roots for f in root.rglob("*.py"))
        elif getattr(mod, "__file__", None):
            f = Path(mod.__file__)  # type: ignore[arg-type]
            files = [(f.name, f)]
        else:
            return ""
        h = hashlib.sha256()
        for rel, f in files:
            h.update(rel.encode())
            size = f.stat().st_size
            h.update(f.read_bytes() if size <= MAX_FILE_BYTES else str(size).encode())
        return h.hexdigest()[:16] if files else ""
    except OSError:
        return ""


__all__ = ["module_source_hash"]
