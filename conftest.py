"""Test-session set-up shared by every package's tests: the session writes its tuning-cache entries
(tuned configs, the torch arbiter's verdicts) into a temporary file, never into the checkout's
``.tracea/`` or the user's cache, unless ``TRACEA_CACHE_PATH`` is already set."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _session_tuning_cache(tmp_path_factory):
    if os.environ.get("TRACEA_CACHE_PATH") or os.environ.get("TRACEA_CACHE_DIR"):
        yield
        return
    os.environ["TRACEA_CACHE_PATH"] = str(tmp_path_factory.mktemp("tracea-cache") / "tuning_cache.json")
    try:
        yield
    finally:
        os.environ.pop("TRACEA_CACHE_PATH", None)
