"""Fused epilogues: an ordered chain of element-wise steps applied to a GEMM/conv accumulator before
the store (bias add, ReLU, GELU in its tanh and erf forms, SiLU)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Union

from ..errors import InvalidArgumentError


class EpilogueKind(enum.Enum):
    """One step of an epilogue chain. ``BIAS`` adds a vector along the output's column/channel axis."""

    BIAS = "bias"
    RELU = "relu"
    GELU_TANH = "gelu_tanh"
    GELU_ERF = "gelu_erf"
    SILU = "silu"

    @property
    def is_activation(self) -> bool:
        return self is not EpilogueKind.BIAS


_ALIASES = {"bias": EpilogueKind.BIAS, "bias_add": EpilogueKind.BIAS, "biasadd": EpilogueKind.BIAS,
            "relu": EpilogueKind.RELU, "gelu": EpilogueKind.GELU_TANH, "gelu_tanh": EpilogueKind.GELU_TANH,
            "gelu_erf": EpilogueKind.GELU_ERF, "silu": EpilogueKind.SILU, "swish": EpilogueKind.SILU}

StepLike = Union[EpilogueKind, str]


@dataclass(frozen=True)
class Epilogue:
    """An ordered, immutable chain of :class:`EpilogueKind` steps.

    ``Epilogue.empty()`` is the identity. Chains are built fluently
    (``Epilogue.empty().bias_add().gelu()``) or parsed (``Epilogue.parse("bias+gelu_erf")``).
    A bias may appear at most once. ``"gelu"`` means the tanh approximation, as in PyTorch's
    ``approximate="tanh"``; ``"gelu_erf"`` is the exact form (PyTorch's default ``F.gelu``).
    """

    steps: tuple[EpilogueKind, ...] = ()

    def __post_init__(self) -> None:
        steps = tuple(_step(s) for s in self.steps)
        object.__setattr__(self, "steps", steps)
        if steps.count(EpilogueKind.BIAS) > 1:
            raise InvalidArgumentError("epilogue", self.key, "at most one bias step")

    @classmethod
    def empty(cls) -> "Epilogue":
        """The empty chain: the accumulator is stored unchanged."""
        return cls(())

    @classmethod
    def of(cls, *steps: StepLike) -> "Epilogue":
        """A chain from steps given as kinds or names, in order."""
        return cls(tuple(steps))  # type: ignore[arg-type]

    @classmethod
    def parse(cls, spec: "Epilogue | str | Iterable[StepLike] | None", arg: str = "epilogue") -> "Epilogue":
        """Accept an Epilogue, None, a ``"+"``/``","`` separated string, or an iterable of steps;
        ``arg`` names the argument in errors."""
        if spec is None:
            return cls.empty()
        if isinstance(spec, Epilogue):
            return spec
        if isinstance(spec, (str, EpilogueKind)):
            text = spec.value if isinstance(spec, EpilogueKind) else spec
            parts = [p for p in text.replace(",", "+").split("+") if p.strip()]
            if text.strip().lower() in ("", "none", "empty"):
                parts = []
        elif isinstance(spec, (bytes, bytearray)) or not hasattr(spec, "__iter__"):
            raise InvalidArgumentError(arg, spec, "an Epilogue, None, a step name or spec string such as "
                                       "'bias+gelu', or a sequence of step names")
        else:
            parts = list(spec)
        try:
            return cls(tuple(parts))  # type: ignore[arg-type]
        except InvalidArgumentError as exc:
            if arg == exc.arg:
                raise
            raise InvalidArgumentError(arg, exc.value, exc.expected) from None

    def _then(self, kind: EpilogueKind) -> "Epilogue":
        return Epilogue(self.steps + (kind,))

    def bias_add(self) -> "Epilogue":
        """This chain followed by a bias add."""
        return self._then(EpilogueKind.BIAS)

    def relu(self) -> "Epilogue":
        """This chain followed by ReLU."""
        return self._then(EpilogueKind.RELU)

    def gelu(self, approximate: str = "tanh") -> "Epilogue":
        """This chain followed by GELU (``approximate="tanh"`` or ``"none"`` for the erf form)."""
        if approximate not in ("tanh", "none", "erf"):
            raise InvalidArgumentError("approximate", approximate, "'tanh' or 'none'")
        return self._then(EpilogueKind.GELU_TANH if approximate == "tanh" else EpilogueKind.GELU_ERF)

    def silu(self) -> "Epilogue":
        """This chain followed by SiLU (x * sigmoid(x))."""
        return self._then(EpilogueKind.SILU)

    @property
    def has_bias(self) -> bool:
        return EpilogueKind.BIAS in self.steps

    @property
    def activations(self) -> tuple[EpilogueKind, ...]:
        return tuple(s for s in self.steps if s.is_activation)

    @property
    def is_empty(self) -> bool:
        return not self.steps

    @property
    def key(self) -> str:
        """Stable text form, ``"none"`` for the empty chain, else steps joined by ``"+"``."""
        return "+".join(s.value for s in self.steps) if self.steps else "none"

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def __str__(self) -> str:
        return self.key

    # Seed-style constructors (Epilogue.BiasAdd() ...), kept for users of the original API.
    @classmethod
    def BiasAdd(cls) -> "Epilogue":  # noqa: N802
        return cls((EpilogueKind.BIAS,))

    @classmethod
    def ReLU(cls) -> "Epilogue":  # noqa: N802
        return cls((EpilogueKind.RELU,))

    @classmethod
    def Gelu(cls) -> "Epilogue":  # noqa: N802
        return cls((EpilogueKind.GELU_TANH,))


def _step(step: StepLike) -> EpilogueKind:
    if isinstance(step, EpilogueKind):
        return step
    if isinstance(step, str):
        found = _ALIASES.get(step.strip().lower())
        if found is not None:
            return found
    raise InvalidArgumentError("epilogue", step, "one of " + ", ".join(sorted(_ALIASES)))
