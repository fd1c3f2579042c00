"""Search spaces: the finite set of :class:`PipelineConfig` a tuner may try for a variant.

Built fluently, as in the seed::

    space = (SearchSpace()
             .tile_m([64, 128]).tile_n([64, 128]).tile_k([32])
             .stages([2, 3])
             .swizzles([SwizzleMode.NONE, SwizzleMode.XOR4])
             .barrier_modes([BarrierMode.NONE, BarrierMode.PRODUCER_CONSUMER])
             .param("mr", [6, 8]))

Every builder method returns a new space (spaces are immutable). ``where`` adds a constraint that
prunes combinations before anything is measured.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import InvalidArgumentError
from .config import BarrierMode, PipelineConfig, SwizzleMode, _CORE_FIELDS, _enum

Constraint = Callable[[PipelineConfig], "bool | str | None"]


@dataclass(frozen=True)
class SearchSpace:
    """An ordered set of named dimensions, each a tuple of candidate values, plus constraints.

    Dimensions left unset take the :class:`PipelineConfig` default. Names other than the core fields
    (``tile_m``, ``tile_n``, ``tile_k``, ``stages``, ``warps``, ``swizzle``, ``barrier``) are
    backend-specific params.
    """

    dims: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    constraints: tuple[Constraint, ...] = field(default=(), compare=False)

    # -- builders -------------------------------------------------------------------------------
    def with_dim(self, name: str, values: Iterable[Any]) -> "SearchSpace":
        """This space with dimension ``name`` set to ``values`` (replacing an existing one)."""
        vals = tuple(values)
        if not vals:
            raise InvalidArgumentError(name, list(vals), "at least one candidate value")
        if name == "swizzle":
            vals = tuple(_enum(SwizzleMode, v, "swizzles") for v in vals)
        elif name == "barrier":
            vals = tuple(_enum(BarrierMode, v, "barrier_modes") for v in vals)
        dims = [(n, v) for n, v in self.dims if n != name] + [(name, tuple(dict.fromkeys(vals)))]
        return SearchSpace(tuple(dims), self.constraints)

    def tile_m(self, values: Sequence[int]) -> "SearchSpace":
        return self.with_dim("tile_m", values)

    def tile_n(self, values: Sequence[int]) -> "SearchSpace":
        return self.with_dim("tile_n", values)

    def tile_k(self, values: Sequence[int]) -> "SearchSpace":
        return self.with_dim("tile_k", values)

    def stages(self, values: Sequence[int]) -> "SearchSpace":
        return self.with_dim("stages", values)

    def warps(self, values: Sequence[int]) -> "SearchSpace":
        return self.with_dim("warps", values)

    def swizzles(self, values: Sequence[SwizzleMode | str]) -> "SearchSpace":
        return self.with_dim("swizzle", values)

    def barrier_modes(self, values: Sequence[BarrierMode | str]) -> "SearchSpace":
        return self.with_dim("barrier", values)

    def param(self, name: str, values: Sequence[Any]) -> "SearchSpace":
        """A backend-specific dimension (``mr``, ``vector_width``, ``cluster`` ...)."""
        return self.with_dim(name, values)

    def where(self, constraint: Constraint) -> "SearchSpace":
        """Add a constraint: it returns True/None to keep a config, False or a reason string to drop it."""
        return SearchSpace(self.dims, self.constraints + (constraint,))

    # -- queries --------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.dims)

    def values(self, name: str) -> tuple[Any, ...]:
        for n, v in self.dims:
            if n == name:
                return v
        raise KeyError(name)

    @property
    def cardinality(self) -> int:
        """Number of raw combinations, before constraints."""
        size = 1
        for _, v in self.dims:
            size *= len(v)
        return size

    def make(self, assignment: Mapping[str, Any]) -> PipelineConfig:
        """The config for one assignment of values to this space's dimensions."""
        core = {k: v for k, v in assignment.items() if k in _CORE_FIELDS}
        params = tuple((k, v) for k, v in assignment.items() if k not in _CORE_FIELDS)
        return PipelineConfig(**core, params=params)

    def rejection(self, config: PipelineConfig) -> str | None:
        """Why ``config`` violates a constraint, or None when it satisfies all."""
        for c in self.constraints:
            verdict = c(config)
            if verdict is False:
                return f"constraint {getattr(c, '__name__', 'lambda')} failed"
            if isinstance(verdict, str) and verdict:
                return verdict
        return None

    def contains(self, config: PipelineConfig) -> bool:
        """True when ``config`` is a point of this space: each dimension's value is one of its
        candidates (equal *and* of the same type, so ``1``, ``1.0`` and ``True`` differ), ``config``
        has no parameters beyond the dimensions, core fields that are not dimensions have their
        default (as :meth:`make` gives them), and the constraints hold. Never raises."""
        if not isinstance(config, PipelineConfig):
            return False
        assignment: dict[str, Any] = {}
        for name, vals in self.dims:
            value = config.get(name)
            if not any(type(c) is type(value) and c == value for c in vals):
                return False
            assignment[name] = value
        try:
            point = self.make(assignment)
            return point == config and point.key == config.key and self.rejection(config) is None
        except Exception:  # noqa: BLE001 - a constraint failing on an odd config: not a member
            return False

    def __iter__(self) -> Iterator[PipelineConfig]:
        """Every config satisfying the constraints, in lexicographic order of the dimensions."""
        names = self.names
        for combo in itertools.product(*(v for _, v in self.dims)):
            cfg = self.make(dict(zip(names, combo)))
            if self.rejection(cfg) is None:
                yield cfg

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def to_dict(self) -> dict[str, list[Any]]:
        return {n: [getattr(x, "value", x) for x in v] for n, v in self.dims}

    @classmethod
    def new(cls) -> "SearchSpace":
        """Seed spelling of ``SearchSpace()``."""
        return cls()
