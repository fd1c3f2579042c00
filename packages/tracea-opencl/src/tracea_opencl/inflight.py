"""Device arrays a launch creates for itself (B packed into panels, a contiguous copy of a source) stay
referenced until the OpenCL command using them has completed.

The launch returns as soon as its commands are enqueued; such a temporary is referenced by nothing
else afterwards. OpenCL defers freeing a released buffer until the commands using it finish, but a
pooling allocator (``pyopencl.tools.MemoryPool``) hands the memory out again at once, so the rule is
kept here rather than left to the allocator: :func:`hold` keeps the objects with the command's event
and drops them once the event reports completion (checked on later calls; the oldest is waited for
when too many are pending).
"""

from __future__ import annotations

import threading
from typing import Any

#: Pending (event, objects) pairs past which :func:`hold` waits for the oldest event.
MAX_PENDING = 256
_lock = threading.Lock()
_pending: list[tuple[Any, tuple[Any, ...]]] = []


def _done(event: Any) -> bool:
    try:
        return int(event.command_execution_status) <= 0  # CL_COMPLETE (0) or an error code (< 0)
    except Exception:  # noqa: BLE001 - a released or foreign event: nothing left to protect
        return True


def hold(event: Any, *objs: Any) -> None:
    """Keep ``objs`` referenced until ``event`` (the command that reads or writes them) has completed."""
    oldest = None
    with _lock:
        _pending[:] = [(e, o) for e, o in _pending if not _done(e)]
        if len(_pending) >= MAX_PENDING:
            oldest = _pending.pop(0)
        _pending.append((event, objs))
    if oldest is not None:
        oldest[0].wait()  # its objects are dropped after the wait, outside the lock


def pending() -> int:
    """How many commands still hold temporaries (for tests)."""
    with _lock:
        _pending[:] = [(e, o) for e, o in _pending if not _done(e)]
        return len(_pending)
