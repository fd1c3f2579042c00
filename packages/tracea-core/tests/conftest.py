from __future__ import annotations

import pytest

from tracea.plugins import create_plugin_manager
from tracea.doctor import Doctor


@pytest.fixture
def core_doctor() -> Doctor:
    """A Doctor over built-in plugins only (no backends), independent of what is installed."""
    return Doctor(create_plugin_manager(autoload=False, blocked=[]))
