"""Packed weight panels of torch tensors kept between calls (AMX conv2d weights, AMX GEMM B operands).

Packing a weight into the tile layout costs about as much as a small GEMM or a deep conv layer at batch
1 (512^3 bf16 GEMM: ~10% of the call; 512@7^2 conv: more than the convolution), and layers call with the
same weight again and again. An entry is keyed on the packing geometry (which library, shape, layout),
the tensor's data address, shape, strides and **version counter** (``Tensor._version``: every in-place
torch operation on the tensor or on a view of it bumps it). An entry holds only a *weak* reference to the
tensor (to its base, for a view such as ``w.t()`` made per call): when that is freed, its entries go with it (so another tensor that later gets the same
memory never meets them, and the cache keeps no tensor alive: not a dropped model's weights, nor the
weight copies the arbiter times on). A tensor is packed into the cache only the second time it is seen
unchanged (the first sighting records its key): a B that changes every call (activations) is packed per
call into the kernel's workspace as before.

What it cannot see: writes that torch does not count -- through ``tensor.data`` (a separate version
counter), a NumPy view of the tensor, DLPack or a C extension. Set ``TRACEA_CPU_WEIGHT_CACHE=0`` to pack
on every call (NumPy arrays, which have no version counter, always are). At most :data:`CACHE_BYTES` of
panels are kept (and :data:`CACHE_ENTRIES` tensors), least recently used first out; a new version of a
tensor replaces the old one's entry. The count bound was 32 until 2026-11-28: a transformer has more
weights than that (ViT-Tiny: 49 linears), and a model that cycles through more weights than the cache
holds misses on every call (least recently used is the worst order for a cycle).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from tracea.runtime.arrays import imported

CACHE_ENTRIES = 4096
CACHE_BYTES = 512 << 20
#: keys seen once (no references held), most recent last
SEEN_KEYS = 256


class PanelCache:
    """Packed panels of torch tensors (see the module docstring for what it can and cannot see)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, tuple[Any, np.ndarray, int, int]] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        # reentrant: a tensor freed while the lock is held runs _forget on this thread
        self._lock = threading.RLock()

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _forget(self, key: tuple, _ref: Any = None) -> None:
        """Drop the entry of a tensor being freed (its weak reference's callback)."""
        with self._lock:
            self._entries.pop(key, None)

    def panels(self, geometry: tuple, w: Any, w_ptr: int, words: int,
               pack: Callable[[int], Any]) -> tuple[np.ndarray, int] | None:
        """``(panels, address)`` of tensor ``w`` (data at ``w_ptr``) packed for ``geometry`` (a hashable
        key naming the library and the packing; ``words``: uint32 words of the panels; ``pack(address)``
        writes them), packed now at the second sighting of the unchanged tensor. Hold ``panels`` until the
        kernel reading them has returned (another thread may evict the entry). None at a first sighting,
        when ``w`` is no torch tensor or when caching is off: the caller packs itself."""
        torch = imported("torch")
        if torch is None or not isinstance(w, torch.Tensor) or os.environ.get("TRACEA_CPU_WEIGHT_CACHE") == "0":
            return None
        key = (geometry, w_ptr, tuple(w.shape), w.stride(), w._version)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0]() is not None:  # (a freed tensor's entry is gone already)
                self._entries.move_to_end(key)
                return hit[1], hit[2]
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > SEEN_KEYS:
                    self._seen.popitem(last=False)
                return None
            del self._seen[key]
        # 64-byte aligned: a tile row that straddles two cache lines costs two L1 accesses
        raw = np.empty(max(int(words), 16) + 16, np.uint32)
        skip = (-raw.ctypes.data % 64) // 4
        panels = raw[skip:skip + max(int(words), 16)]
        addr = panels.ctypes.data
        pack(addr)
        base = getattr(w, "_base", None)  # a view (w.t(), a permute) lives no longer than one call; its base does
        try:
            ref = weakref.ref(w if base is None else base, functools.partial(self._forget, key))
        except TypeError:  # (no torch tensor refuses a weak reference; a stand-in might)
            return panels, addr
        held = panels.nbytes
        with self._lock:
            for k in [k for k in self._entries if k[:4] == key[:4]]:  # older versions of the same tensor
                del self._entries[k]
            self._entries[key] = (ref, panels, addr, held)
            total = sum(e[3] for e in self._entries.values())
            while len(self._entries) > CACHE_ENTRIES or (total > CACHE_BYTES and len(self._entries) > 1):
                _, (_, _, _, gone) = self._entries.popitem(last=False)
                total -= gone
        return panels, addr


#: the process-wide cache every AMX variant uses
PANELS = PanelCache()
