"""The variant registry: every kernel variant contributed by every plugin, by unique name."""

from __future__ import annotations

from typing import Iterable, Iterator

from ..errors import PluginError
from ..ir.ops import LayerType
from .variant import KernelVariant


class VariantRegistry:
    """Variants by name. Adding a duplicate name or a variant without name/backend/requirements raises
    :class:`~tracea.errors.PluginError` naming the offender."""

    def __init__(self, variants: Iterable[KernelVariant] = ()) -> None:
        self._by_name: dict[str, KernelVariant] = {}
        for v in variants:
            self.add(v)

    def add(self, variant: KernelVariant) -> None:
        if not isinstance(variant, KernelVariant):
            raise PluginError(f"tracea_register_variants returned {variant!r}, not a KernelVariant")
        if not variant.name or not variant.backend or not hasattr(variant, "requirements"):
            raise PluginError(f"variant {variant!r} needs a name, a backend and requirements")
        if variant.name in self._by_name:
            other = self._by_name[variant.name]
            raise PluginError(f"duplicate variant name {variant.name!r} from backends "
                              f"{other.backend!r} and {variant.backend!r}")
        self._by_name[variant.name] = variant

    def get(self, name: str) -> KernelVariant | None:
        return self._by_name.get(name)

    def for_kind(self, kind: LayerType) -> list[KernelVariant]:
        return [v for v in self._by_name.values() if v.op_kind is kind]

    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self) -> Iterator[KernelVariant]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)
