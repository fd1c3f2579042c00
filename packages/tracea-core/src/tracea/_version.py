"""Single source of the Tracea version; every package of the monorepo moves in lockstep with it."""

__version__ = "0.1.0"
