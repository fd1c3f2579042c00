"""Fixtures of the repository-level tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs every run (the seed shows in the generator's repr on failure)."""
    return np.random.default_rng()
