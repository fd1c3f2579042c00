"""Test-session set-up shared by every package's tests.

- The session writes its tuning-cache entries (tuned configs, the torch arbiter's verdicts) into a
  temporary file, never into the checkout's ``.tracea/`` or the user's cache, unless
  ``TRACEA_CACHE_PATH`` is already set.
- ``rng``: a NumPy generator with fresh random inputs every run, yet reproducible. The session seed
  comes from ``--rng-seed N`` (or ``TRACEA_TEST_SEED``), else from the OS; each test's generator is
  seeded with (session seed, test id), so one failing test replays alone. The seed is printed in the
  report header and under every failing test that used ``rng`` ("rerun with --rng-seed N").
"""

from __future__ import annotations

import os
import secrets
import zlib

import numpy as np
import pytest

SEED_ENV = "TRACEA_TEST_SEED"
_seed_key = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rng-seed", type=int, default=None,
                     help=f"session seed of the rng fixture (default: ${SEED_ENV}, else random)")


def pytest_configure(config: pytest.Config) -> None:
    seed = config.getoption("--rng-seed")
    if seed is None and os.environ.get(SEED_ENV):
        seed = int(os.environ[SEED_ENV])
    config.stash[_seed_key] = seed if seed is not None else secrets.randbits(32)


def pytest_report_header(config: pytest.Config) -> str:
    return f"rng seed: {config.stash[_seed_key]} (replay with --rng-seed {config.stash[_seed_key]})"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Fresh random inputs, reproducible from the seed shown in the report (see the module docstring)."""
    seed = request.config.stash[_seed_key]
    request.node.user_properties.append(("rng_seed", seed))
    return np.random.default_rng([seed, zlib.crc32(request.node.nodeid.encode())])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.failed and "rng" in getattr(item, "fixturenames", ()):
        seed = item.config.stash[_seed_key]
        report.sections.append(("rng", f"rng seed {seed}: replay with  pytest --rng-seed {seed} '{item.nodeid}'"))
    return report


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
