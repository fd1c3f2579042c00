"""Where Tracea keeps files outside the project: the per-user cache folder (compiled kernels), from
`platformdirs <https://platformdirs.readthedocs.io>`_, so ``XDG_CACHE_HOME`` is honoured on Linux
(default ``~/.cache/tracea``), ``~/Library/Caches/tracea`` on macOS, ``%LOCALAPPDATA%\\tracea\\Cache`` on
Windows. Each backend's folder can be moved with its own variable (``TRACEA_CPU_CACHE_DIR``,
``TRACEA_CUDA_CACHE_DIR``). The tuning cache is project-local instead (``./.tracea``, see
:mod:`tracea.tuning.cache`)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def user_cache_dir(*parts: str, env: str | None = None) -> Path:
    """``$<env>`` when that variable is set (``~`` expanded), else the user cache folder of Tracea
    joined with ``parts`` (``user_cache_dir("cuda")`` -> ``~/.cache/tracea/cuda`` on Linux)."""
    override = os.environ.get(env) if env else None
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("tracea", appauthor=False)).joinpath(*parts)
