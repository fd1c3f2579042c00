"""The packed-weight cache (``tracea_cpu.panel_cache``) on its own, with a counting stand-in for the packer:
second-sighting packing, hits, in-place updates, entries that go with their tensor (no tensor kept alive,
no stale entry for memory a new tensor reuses), views of a kept base, and a model cycling through more
weights than the old 32-entry bound (every call missed then)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tracea_cpu.panel_cache import PanelCache

torch = pytest.importorskip("torch")


class _Packer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, addr: int) -> None:
        self.calls += 1


def _ask(cache: PanelCache, w, pack: _Packer):  # noqa: ANN001, ANN202
    return cache.panels(("test", 1), w, w.data_ptr(), 64, pack)


def test_second_sighting_packs_then_hits_and_an_update_repacks():
    cache, pack, w = PanelCache(), _Packer(), torch.randn(8, 8)
    assert _ask(cache, w, pack) is None and pack.calls == 0  # first sighting: the caller packs itself
    first = _ask(cache, w, pack)
    assert first is not None and pack.calls == 1 and first[1] % 64 == 0
    again = _ask(cache, w, pack)
    assert again is not None and again[1] == first[1] and pack.calls == 1 and len(cache) == 1
    w.mul_(2)  # a new version: seen once, then packed again; the old version's entry goes
    assert _ask(cache, w, pack) is None
    assert _ask(cache, w, pack) is not None and pack.calls == 2 and len(cache) == 1


def test_an_entry_goes_with_its_tensor_and_keeps_nothing_alive():
    cache, pack = PanelCache(), _Packer()
    w = torch.randn(16, 4)
    _ask(cache, w, pack)
    _ask(cache, w, pack)
    assert len(cache) == 1
    del w
    gc.collect()
    assert len(cache) == 0
    # a new tensor in whatever memory is free now starts over (never another tensor's panels)
    v = torch.randn(16, 4)
    assert _ask(cache, v, pack) is None


def test_views_made_per_call_are_kept_through_their_base():
    cache, pack, w = PanelCache(), _Packer(), torch.randn(6, 10)
    for _ in range(4):
        _ask(cache, w.t(), pack)  # a fresh view object each call, as a layer's w.t() is
        gc.collect()
    assert pack.calls == 1 and len(cache) == 1


def test_more_weights_than_the_old_bound_all_hit():
    cache, pack = PanelCache(), _Packer()
    weights = [torch.randn(4, 4) for _ in range(80)]  # a ViT-sized layer count
    for _ in range(3):
        for w in weights:
            _ask(cache, w, pack)
    assert pack.calls == 80 and len(cache) == 80


def test_numpy_and_disabled_cache_pack_per_call(monkeypatch):
    cache, pack = PanelCache(), _Packer()
    a = np.zeros((4, 4), np.float32)
    assert cache.panels(("test", 1), a, a.ctypes.data, 16, pack) is None
    monkeypatch.setenv("TRACEA_CPU_WEIGHT_CACHE", "0")
    w = torch.randn(4, 4)
    assert all(_ask(cache, w, pack) is None for _ in range(3)) and pack.calls == 0
