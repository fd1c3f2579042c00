"""A plugin that records which kernel variant (or framework fallback) ran each call, so results are
grouped by the backend that computed them. Each event is also passed to ``on_event`` before the
kernel runs: a worker writes it to the runner, which then knows what was running if the process dies."""

from __future__ import annotations

from typing import Any, Callable

from ..plugins.manager import hookimpl


class Recorder:
    """Hook wrappers around ``tracea_run_variant`` and ``tracea_fallback_run``."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.on_event = on_event

    def _note(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    @hookimpl(wrapper=True)
    def tracea_run_variant(self, variant: Any, op: Any, config: Any, args: Any, profile: Any) -> Any:
        self._note({"variant": variant.name, "backend": variant.backend, "op": op.describe(),
                    "config": getattr(config, "key", str(config))})
        return (yield)

    @hookimpl(wrapper=True)
    def tracea_fallback_run(self, op: Any, arrays: Any, out: Any, reason: str) -> Any:
        self._note({"variant": "fallback", "backend": "fallback", "op": op.describe(), "reason": reason})
        return (yield)

    def take(self) -> list[dict[str, Any]]:
        """The events since the last call."""
        events, self.events = self.events, []
        return events


def install(on_event: Callable[[dict[str, Any]], None] | None = None) -> Recorder:
    """Register a :class:`Recorder` with the process-wide plugin manager."""
    from ..plugins.manager import get_plugin_manager

    rec = Recorder(on_event)
    get_plugin_manager().register(rec, name="tracea-fuzz-recorder")
    return rec


def backend_of(events: list[dict[str, Any]]) -> str:
    """The backend that computed a call: the last variant run, ``fallback``, or ``none``."""
    return events[-1]["backend"] if events else "none"
