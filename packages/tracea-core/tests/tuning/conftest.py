"""Fixtures of the tuner tests: a Doctor with the test-only NumPy backend and a cache in tmp_path."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def doctor():
    import tracea_tuning_testplugin as plugin
    from tracea.plugins import manager

    saved = manager._manager
    plugin.RUNS.clear()
    yield plugin.make_doctor()
    manager.set_plugin_manager(saved)


@pytest.fixture
def cache(tmp_path):
    from tracea.tuning.cache import TuningCache

    return TuningCache(tmp_path / "tuning_cache.json")


@pytest.fixture
def subprocess_env(tmp_path):
    """Environment for a child Python that loads the test plugin and uses the tmp cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env["TRACEA_CACHE_PATH"] = str(tmp_path / "tuning_cache.json")
    return env
