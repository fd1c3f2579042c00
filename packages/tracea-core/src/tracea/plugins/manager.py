"""The plugin manager: discovery, blocking, tracing.

Environment variables:

``TRACEA_PLUGINS``
    Comma-separated plugin modules to load, each ``module`` or ``name=module``
    (``TRACEA_PLUGINS=tracea_cpu.plugin,tracea_cuda.plugin``). This is how plugins load when running
    from source without installed distributions (no entry points).
``TRACEA_DISABLE_PLUGIN_AUTOLOAD``
    When set to 1/true, entry points of the ``tracea`` group are not loaded (``TRACEA_PLUGINS`` still is).
``TRACEA_BLOCK_PLUGINS``
    Comma-separated plugin names (entry-point names or module paths) never to load.
``TRACEA_TRACE_PLUGINS``
    When set, every hook call and result is printed to stderr.

A plugin that fails to import is recorded in :attr:`TraceaPluginManager.load_errors` (shown by
``tracea doctor``) and does not stop the others.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import traceback
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from ..errors import PluginError
from . import hookspecs

ENTRY_POINT_GROUP = "tracea"
ENV_PLUGINS = "TRACEA_PLUGINS"
ENV_DISABLE_AUTOLOAD = "TRACEA_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "TRACEA_BLOCK_PLUGINS"
ENV_TRACE = "TRACEA_TRACE_PLUGINS"

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT)

# Built into core: the host CPU profiler, the NumPy reference backend, the fallback delegation and the
# tuner's fallback timer (tracea_measure with time.perf_counter).
BUILTIN_PLUGINS = (
    ("host", "tracea.doctor.host_plugin"),
    ("reference", "tracea.reference.plugin"),
    ("delegate", "tracea.plugins.delegate"),
    ("tuning", "tracea.tuning.measure"),
)


class TraceaPluginManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` that also remembers where each plugin came from and which failed."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.sources: dict[str, str] = {}
        self.load_errors: dict[str, str] = {}

    def register_plugin(self, plugin: Any, name: str, source: str) -> None:
        """Register ``plugin`` under ``name`` unless blocked or already registered."""
        if self.is_blocked(name) or self.has_plugin(name):
            return
        if self.get_name(plugin) is not None:  # same module already registered under another name
            return
        self.register(plugin, name=name)
        self.sources[name] = source

    def load_module(self, name: str, module_path: str, source: str) -> ModuleType | None:
        """Import ``module_path`` and register it; import failures are recorded, not raised."""
        if self.is_blocked(name) or self.is_blocked(module_path):
            return None
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break Tracea
            self.load_errors[name] = f"{type(exc).__name__}: {exc}"
            return None
        self.register_plugin(module, name, source)
        return module


_lock = threading.Lock()
_manager: TraceaPluginManager | None = None


def _split(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def create_plugin_manager(*, autoload: bool | None = None, extra: list[str] | None = None,
                          blocked: list[str] | None = None) -> TraceaPluginManager:
    """Build a fresh manager: built-ins, then ``TRACEA_PLUGINS`` modules, then entry points.

    :param autoload: load entry points (default: unless ``TRACEA_DISABLE_PLUGIN_AUTOLOAD`` is set).
    :param extra: more plugin modules (``module`` or ``name=module``), as ``TRACEA_PLUGINS``.
    :param blocked: more names to block, as ``TRACEA_BLOCK_PLUGINS``.
    """
    pm = TraceaPluginManager()
    for name in _split(os.environ.get(ENV_BLOCK)) + list(blocked or []):
        pm.set_blocked(name)
    for name, path in BUILTIN_PLUGINS:
        module = pm.load_module(name, path, "builtin")
        if module is None and name in pm.load_errors:  # pragma: no cover - core is broken
            raise PluginError(f"built-in plugin {path} failed: {pm.load_errors[name]}")
    for spec in _split(os.environ.get(ENV_PLUGINS)) + list(extra or []):
        name, _, path = spec.rpartition("=")
        pm.load_module(name or path, path, "env")
    if autoload is None:
        autoload = not _truthy(os.environ.get(ENV_DISABLE_AUTOLOAD))
    if autoload:
        for ep in _entry_points():
            if pm.is_blocked(ep.name) or pm.is_blocked(ep.value) or pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001
                pm.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            pm.register_plugin(plugin, ep.name, f"entry point ({_dist_name(ep)})")
    pm.check_pending()
    if _truthy(os.environ.get(ENV_TRACE)):
        pm.trace.root.setwriter(lambda text: sys.stderr.write(text))
        pm.enable_tracing()
    return pm


def _entry_points() -> list[metadata.EntryPoint]:
    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # pragma: no cover - broken metadata
        traceback.print_exc()
        return []


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", "?") if dist is not None else "?"


def get_plugin_manager() -> TraceaPluginManager:
    """The process-wide manager, created on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = create_plugin_manager()
        return _manager


def set_plugin_manager(pm: TraceaPluginManager | None) -> None:
    """Replace (or with None, reset) the process-wide manager and every cache derived from it."""
    global _manager
    with _lock:
        _manager = pm
    for fn in list(_on_change):
        fn()


_on_change: list[Any] = []


def on_change(fn: Any) -> None:
    """Call ``fn()`` whenever the process-wide manager is replaced (the Doctor resets itself)."""
    _on_change.append(fn)
