from __future__ import annotations

from collections.abc import Iterator

import pytest

from tracea.plugins import create_plugin_manager, set_plugin_manager
from tracea.doctor import Doctor


@pytest.fixture
def no_env_plugin_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests that build plugin managers without autoloading and expect no backend in them: a
    ``TRACEA_PLUGINS`` list from the shell (``scripts/srcenv.sh`` sets one to run from source) would add
    its backends. The process-wide manager is reset before and after: one built while the list is gone
    would serve later tests (other packages' in the same process) without their backends."""
    monkeypatch.delenv("TRACEA_PLUGINS", raising=False)
    set_plugin_manager(None)
    yield
    set_plugin_manager(None)


@pytest.fixture
def core_doctor() -> Doctor:
    """A Doctor over built-in plugins only (no backends), independent of what is installed."""
    return Doctor(create_plugin_manager(autoload=False, blocked=[]))
