"""Built-in fallback implementations (``trylast``) of the per-variant hooks: they call the variant's own
methods, so a backend only overrides a hook when it wants to do something else."""

from __future__ import annotations

from typing import Any

from .manager import hookimpl


@hookimpl(trylast=True)
def tracea_search_space(variant: Any, op: Any, profile: Any) -> Any:
    return variant.search_space(op, profile)


@hookimpl(trylast=True)
def tracea_hero_configs(variant: Any, op: Any, profile: Any) -> Any:
    return list(variant.hero_configs(op, profile))


@hookimpl(trylast=True)
def tracea_prepare_variant(variant: Any, op: Any, config: Any, profile: Any) -> Any:
    handle = variant.prepare(op, config, profile)
    return True if handle is None else handle


@hookimpl(trylast=True)
def tracea_run_variant(variant: Any, op: Any, config: Any, args: Any, profile: Any) -> Any:
    variant.run(op, config, args, profile)
    return True



@hookimpl(trylast=True)
def tracea_bind_variant(variant: Any, op: Any, config: Any, profile: Any, adapter: Any) -> Any:
    from ..doctor.variant import run_launcher

    launch = variant.bind(op, config, profile, adapter)
    return launch if launch is not None else run_launcher(tracea_run_variant, variant, op, config, profile, adapter)
