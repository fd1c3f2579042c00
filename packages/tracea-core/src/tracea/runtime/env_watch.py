"""A write counter on ``os.environ``, so hot paths can notice environment changes with one integer compare.

The plan cache must see a change of the variables that steer choices (``TRACEA_VARIANT``,
``TRACEA_ARBITER``, ...) on the very next call, and a patched layer checks that on every call. Reading ten
variables costs ~0.3 us warm, but inside a model forward, where the caches are cold, it measured ~1.5 us
a call (a CPU decoder block's decode forward: +10 us over seven layers). So :func:`install` swaps
``os.environ``'s private data dict (and ``os.environb``'s, which is the same dict on POSIX) for a
:class:`CountingDict`: the same items, the same behaviour, plus a counter that every write through
``os.environ`` / ``os.environb`` (item assignment, ``del``, ``pop``, ``update``, ``clear``, ...) bumps.
Readers compare :data:`WRITES` ``[0]`` with the value they last saw and re-read the variables only when
it moved.

Not seen, as before: ``os.putenv`` / ``os.unsetenv`` called directly (they bypass ``os.environ``, which
then disagrees with the process environment anyway) and C code calling ``setenv``. Where the swap is not
possible (no ``_data`` dict of the expected type: another platform or Python), :func:`install` returns
False and callers read the variables on every call instead.
"""

from __future__ import annotations

import os
from typing import Any

#: ``[n]``: bumped by every write to the watched environment dict (a list: read without a global lookup)
WRITES = [0]


class CountingDict(dict):
    """``os.environ``'s data dict that counts writes in :data:`WRITES` (reads are plain dict reads)."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        WRITES[0] += 1

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        WRITES[0] += 1

    def pop(self, *args: Any) -> Any:  # type: ignore[override]
        try:
            return dict.pop(self, *args)
        finally:
            WRITES[0] += 1

    def popitem(self) -> Any:
        try:
            return dict.popitem(self)
        finally:
            WRITES[0] += 1

    def clear(self) -> None:
        dict.clear(self)
        WRITES[0] += 1

    def update(self, *args: Any, **kwargs: Any) -> None:
        dict.update(self, *args, **kwargs)
        WRITES[0] += 1

    def setdefault(self, key: Any, default: Any = None) -> Any:
        try:
            return dict.setdefault(self, key, default)
        finally:
            WRITES[0] += 1

    def __ior__(self, other: Any) -> "CountingDict":  # type: ignore[override,misc]
        dict.update(self, other)
        WRITES[0] += 1
        return self


def install() -> bool:
    """Swap ``os.environ``'s data dict for a :class:`CountingDict` (once; also ``os.environb``'s where it
    shares it). True when writes through ``os.environ`` are counted from now on."""
    data = getattr(os.environ, "_data", None)
    if type(data) is CountingDict:
        return True
    if type(data) is not dict:
        return False
    watched = CountingDict(data)
    environb = getattr(os, "environb", None)
    shared = environb is not None and getattr(environb, "_data", None) is data
    try:
        os.environ._data = watched  # type: ignore[attr-defined]
        if shared:
            environb._data = watched  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a read-only mapping elsewhere: callers fall back to reading
        return False
    return True


__all__ = ["WRITES", "CountingDict", "install"]
