"""Performance model: the Doctor's estimate of an untuned variant's time, fitted to measured data.

Backends ship measured data per architecture (the ``tracea_perf_data`` hook returns data files, see
:mod:`.data`); the user's own tuning records (tuning-cache entries of this device that recorded their
default config's time) are added. :mod:`.model` turns them into estimates; :mod:`.features` says what
is compared. Without data for the device's architecture, or with ``TRACEA_PERF_MODEL=0``, the Doctor
ranks by the variants' roofline estimates, as before.

Environment: ``TRACEA_PERF_MODEL=0`` turns the model off; ``TRACEA_PERF_DATA`` lists extra data files
(``os.pathsep``-separated), read after the backends' own.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Iterable

from .data import DataFile, Observation, load_file, roofline_profile, user_observations
from .features import arch_key
from .model import Estimate, Neighbor, PerfModel, roofline_estimate

ENV_MODEL = "TRACEA_PERF_MODEL"
ENV_DATA = "TRACEA_PERF_DATA"


def enabled() -> bool:
    """False when ``TRACEA_PERF_MODEL`` is 0/off/false/no."""
    return (os.environ.get(ENV_MODEL) or "").strip().lower() not in ("0", "off", "false", "no")


def extra_files() -> list[str]:
    """Data files named by ``TRACEA_PERF_DATA``."""
    return [p for p in (os.environ.get(ENV_DATA) or "").split(os.pathsep) if p.strip()]


def build(profile: Any, variants: dict[str, Any], files: Iterable[DataFile], entries: Iterable[Any] = (),
          device_fp: str = "", user: list[Observation] | None = None) -> PerfModel:
    """A model for ``profile`` from loaded data files (those of its architecture) and cache entries
    (``user``: their :func:`user_observations` for ``device_fp``, when the caller has them already)."""
    arch = arch_key(profile)
    obs: list[Observation] = []
    sources: list[str] = []
    problems: list[str] = []
    others: set[str] = set()
    measured_on: dict[str, Any] = {}  # a file's rows are residuals against its own device's roofline
    for f in files:
        name = os.path.basename(f.path)
        if not f.ok:
            problems.append(f"{name} not used: {f.problem}")
            continue
        if f.arch_key != arch:
            others.add(f.arch_key)
            continue
        if f.skipped_rows:
            problems.append(f"{name}: {f.skipped_rows} malformed row(s) skipped")
        fitted = sum(1 for o in f.observations if o.split != "heldout")
        sources.append(f"{name} ({fitted} points" + (f", {f.device_name}" if f.device_name else "") + ")")
        rows: Iterable[Observation] = f.observations
        if name in measured_on:  # two files of one name (yours on TRACEA_PERF_DATA, say): each keeps its device
            name = str(f.path)
            rows = [replace(o, source=name) for o in f.observations]
        obs.extend(rows)
        measured_on[name] = roofline_profile(profile, f.profile)
    if user is None:
        user = user_observations(entries, device_fp) if device_fp else []
    if user:
        sources.append(f"your tuning cache ({len(user)} points)")
        obs.extend(user)
    if not sources and others:
        problems.append(f"data exists for {', '.join(sorted(others))} but not for this device's {arch}")
    return PerfModel.fit(arch, obs, variants, profile, sources, problems, measured_on)


__all__ = ["DataFile", "Estimate", "Neighbor", "Observation", "PerfModel", "arch_key", "build", "enabled",
           "extra_files", "load_file", "roofline_estimate", "roofline_profile", "user_observations", "ENV_DATA",
           "ENV_MODEL"]
