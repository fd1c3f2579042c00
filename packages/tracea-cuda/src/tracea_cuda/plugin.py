"""Tracea plugin entry point for the cuda package (entry-point group ``tracea``, name ``cuda``)."""

from __future__ import annotations

from tracea.plugins import BackendInfo, hookimpl

from ._version import __version__


@hookimpl
def tracea_backend_info() -> BackendInfo:
    return BackendInfo(name="cuda", version=__version__, package="tracea-cuda", available=False,
                       reason="no kernels yet (skeleton)")


@hookimpl
def tracea_register_variants() -> list:
    return []
