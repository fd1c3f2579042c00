"""Tracea plugin entry point for the cpu package (entry-point group ``tracea``, name ``cpu``)."""

from __future__ import annotations

from tracea.plugins import BackendInfo, hookimpl

from ._version import __version__


@hookimpl
def tracea_backend_info() -> BackendInfo:
    return BackendInfo(name="cpu", version=__version__, package="tracea-cpu", available=False,
                       reason="no kernels yet (skeleton)")


@hookimpl
def tracea_register_variants() -> list:
    return []
