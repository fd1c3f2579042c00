"""The ``tracea`` command-line interface."""
