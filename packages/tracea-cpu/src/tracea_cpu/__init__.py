"""Tracea cpu backend package (see README.md)."""

from ._version import __version__

__all__ = ["__version__"]
