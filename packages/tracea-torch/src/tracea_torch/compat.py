"""Which torch versions tracea-torch works with, checked before anything is patched or registered.

``torch.library.custom_op`` / ``register_fake`` / ``register_autograd`` appeared in torch 2.4, so older
versions are refused with a clear error. Versions newer than the newest one tested still work in
principle (the APIs used are public and stable) but warn once, since patching internals such as
``nn.Conv2d.forward`` is only verified on the tested range.
"""

from __future__ import annotations

import warnings

from packaging.version import InvalidVersion, Version

from tracea.errors import UnsupportedConfigError, VersionWarning

#: Oldest supported torch (custom_op, register_fake, register_autograd, opcheck).
TORCH_MIN = (2, 4)
#: Newest torch minor version the test suite has run on.
TORCH_TESTED_MAX = (2, 13)

_warned = False


def parse_version(text: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13)`` (PEP 440, through ``packaging``); unparsable text gives ``(0, 0)``."""
    try:
        release = Version(text).release
    except InvalidVersion:
        return (0, 0)
    return (release[0], release[1] if len(release) > 1 else 0)


def torch_version() -> tuple[int, int]:
    import torch

    return parse_version(torch.__version__)


def check_torch_version(version: tuple[int, int] | None = None) -> tuple[int, int]:
    """Raise for a torch older than :data:`TORCH_MIN`; warn once for one newer than tested.

    :returns: the (major, minor) version checked.
    :raises UnsupportedConfigError: torch is too old.
    """
    global _warned
    ver = torch_version() if version is None else version
    if ver < TORCH_MIN:
        raise UnsupportedConfigError(
            f"tracea-torch needs torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]} (torch.library.custom_op); "
            f"found {ver[0]}.{ver[1]}: pip install -U torch")
    if ver > TORCH_TESTED_MAX and not _warned:
        _warned = True
        warnings.warn(f"tracea-torch is tested with torch {TORCH_MIN[0]}.{TORCH_MIN[1]} to "
                      f"{TORCH_TESTED_MAX[0]}.{TORCH_TESTED_MAX[1]}; torch {ver[0]}.{ver[1]} is newer and "
                      "untested", VersionWarning, stacklevel=3)
    return ver
