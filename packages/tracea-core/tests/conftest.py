from __future__ import annotations

import numpy as np
import pytest

from tracea.plugins import create_plugin_manager
from tracea.doctor import Doctor


@pytest.fixture
def rng() -> np.random.Generator:
    # Fresh inputs every run (the seed is printed on failure through the generator's repr).
    return np.random.default_rng()


@pytest.fixture
def core_doctor() -> Doctor:
    """A Doctor over built-in plugins only (no backends), independent of what is installed."""
    return Doctor(create_plugin_manager(autoload=False, blocked=[]))
