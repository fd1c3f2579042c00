"""Tracea plugin entry point for the opencl package (entry-point group ``tracea``, name ``opencl``)."""

from __future__ import annotations

from tracea.plugins import BackendInfo, hookimpl

from ._version import __version__


@hookimpl
def tracea_backend_info() -> BackendInfo:
    return BackendInfo(name="opencl", version=__version__, package="tracea-opencl", available=False,
                       reason="no kernels yet (skeleton)")


@hookimpl
def tracea_register_variants() -> list:
    return []
