"""What a backend plugin says about itself (``tracea_backend_info`` hook)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class BackendInfo:
    """Identity and availability of one backend.

    :param name: short backend name (``"cpu"``, ``"cuda"``), the ``backend`` of its variants.
    :param version: the backend package's version (lockstep with core's; a mismatch is reported).
    :param available: whether it can run here.
    :param reason: when unavailable, why, and what to install.
    :param details: facts for the report (compiler path and version, toolkit versions ...).
    :param package: the distribution that provides it (``"tracea-cpu"``).
    """

    name: str
    version: str
    available: bool = True
    reason: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    package: str = ""
