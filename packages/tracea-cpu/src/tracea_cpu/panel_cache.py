"""Packed weight panels of torch tensors kept between calls (AMX conv2d weights, AMX GEMM B operands).

Packing a weight into the tile layout costs about as much as a small GEMM or a deep conv layer at batch
1 (512^3 bf16 GEMM: ~10% of the call; 512@7^2 conv: more than the convolution), and layers call with the
same weight again and again. An entry is keyed on the packing geometry (which library, shape, layout),
the tensor's data address, shape, strides and **version counter** (``Tensor._version``: every in-place
torch operation on the tensor or on a view of it bumps it), and holds a reference to the tensor, so its
memory cannot be freed and reused by another tensor while the entry lives. A tensor is packed into the
cache only the second time it is seen unchanged (the first sighting records its key, no reference): a
B that changes every call (activations) is packed per call into the kernel's workspace as before and is
not kept alive by the cache.

What it cannot see: writes that torch does not count -- through ``tensor.data`` (a separate version
counter), a NumPy view of the tensor, DLPack or a C extension. Set ``TRACEA_CPU_WEIGHT_CACHE=0`` to pack
on every call (NumPy arrays, which have no version counter, always are). At most :data:`CACHE_ENTRIES`
tensors and :data:`CACHE_BYTES` of panels plus the tensors they hold are kept, least recently used first
out; a new version of a tensor replaces the old one's entry.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from tracea.runtime.arrays import imported

CACHE_ENTRIES = 32
CACHE_BYTES = 512 << 20
#: keys seen once (no references held), most recent last
SEEN_KEYS = 256


class PanelCache:
    """Packed panels of torch tensors (see the module docstring for what it can and cannot see)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, tuple[Any, np.ndarray, int, int]] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._entries)

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
            if hit is not None:
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
        held = panels.nbytes + _storage_bytes(w)
        with self._lock:
            for k in [k for k in self._entries if k[:4] == key[:4]]:  # older versions of the same tensor
                del self._entries[k]
            self._entries[key] = (w, panels, addr, held)
            total = sum(e[3] for e in self._entries.values())
            while len(self._entries) > CACHE_ENTRIES or (total > CACHE_BYTES and len(self._entries) > 1):
                _, (_, _, _, gone) = self._entries.popitem(last=False)
                total -= gone
        return panels, addr


def _storage_bytes(w: Any) -> int:
    """Bytes of the storage a tensor keeps alive (its own size when that cannot be asked)."""
    try:
        return int(w.untyped_storage().nbytes())
    except (AttributeError, RuntimeError):
        return int(w.numel() * w.element_size())


#: the process-wide cache every AMX variant uses
PANELS = PanelCache()
