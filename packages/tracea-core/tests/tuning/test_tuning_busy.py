"""The busy-CPU check before CPU tuning: it measures other processes' load and warns once per process."""

from __future__ import annotations

import warnings

import pytest

from tracea.tuning import busy


def test_other_cpu_load_is_a_small_nonnegative_number_or_none():
    load = busy.other_cpu_load(0.05)
    assert load is None or 0.0 <= load < 1024


def test_warns_once_when_others_keep_the_cpu_busy(monkeypatch):
    monkeypatch.setattr(busy, "_warned", False)
    with pytest.warns(RuntimeWarning, match="busy CPU: other processes keep 1.5 cores busy"):
        assert busy.warn_if_busy(sample=lambda: 1.5) == 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        busy.warn_if_busy(sample=lambda: 1.5)  # once per process
        monkeypatch.setattr(busy, "_warned", False)
        assert busy.warn_if_busy(sample=lambda: 0.2) == 0.2  # quiet: nothing
        assert busy.warn_if_busy(sample=lambda: None) is None  # unmeasurable: nothing
