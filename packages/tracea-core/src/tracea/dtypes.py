"""Data types known to Tracea.

A :class:`DType` names how numbers are stored (``f32``, ``f16``, ``bf16``, ``fp8_e4m3`` ...) or, for
``tf32``, a compute mode: TF32 values are stored as float32 and only the Tensor Core multiply rounds
them. :func:`DType.parse` accepts Tracea dtypes, strings, NumPy dtypes and framework dtypes (anything
whose ``str()`` names a dtype, such as ``torch.float16``) without importing any framework.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from .errors import DTypeError


class DType(enum.Enum):
    """A storage type or compute mode. The value is the canonical lower-case name."""

    F64 = "float64"
    F32 = "float32"
    TF32 = "tf32"
    F16 = "float16"
    BF16 = "bfloat16"
    FP8_E4M3 = "float8_e4m3fn"
    FP8_E5M2 = "float8_e5m2"
    INT8 = "int8"
    INT32 = "int32"

    @property
    def bits(self) -> int:
        """Bits per stored element (TF32 is stored as 32-bit float)."""
        return _BITS[self]

    @property
    def itemsize(self) -> int:
        """Bytes per stored element."""
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        """True for every floating type, including fp8 and the TF32 compute mode."""
        return self not in (DType.INT8, DType.INT32)

    @property
    def storage(self) -> "DType":
        """The type values are stored in (``TF32`` -> ``F32``; every other type is its own storage)."""
        return DType.F32 if self is DType.TF32 else self

    @property
    def short(self) -> str:
        """Short name used in keys and tables (``f32``, ``bf16``, ``e4m3``)."""
        return _SHORT[self]

    @property
    def numpy(self) -> np.dtype | None:
        """The NumPy dtype storing this type, or None where NumPy has none (bf16/fp8 need ml_dtypes)."""
        name = self.storage.value
        if name in ("float64", "float32", "float16", "int8", "int32"):
            return np.dtype(name)
        try:  # ml_dtypes gives NumPy bf16/fp8 when installed; never required.
            import ml_dtypes  # type: ignore[import-not-found]

            return np.dtype(getattr(ml_dtypes, {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn",
                                                "float8_e5m2": "float8_e5m2"}[name]))
        except (ImportError, AttributeError, KeyError):
            return None

    @classmethod
    def parse(cls, value: Any, arg: str = "dtype") -> "DType":
        """Turn ``value`` into a :class:`DType`.

        :param value: a DType, a name or alias (``"fp16"``, ``"half"``, ``"bf16"``, ``"e4m3"``), a NumPy
            dtype or scalar type, or a framework dtype such as ``torch.float32``.
        :param arg: the argument name used in the error message.
        :raises DTypeError: when the value names no dtype Tracea knows.
        """
        if isinstance(value, DType):
            return value
        try:
            return _PARSED[value]
        except (KeyError, TypeError):
            pass
        found = cls._parse(value)
        if found is not None:
            try:
                if len(_PARSED) < 1024:
                    _PARSED[value] = found
            except TypeError:  # unhashable value
                pass
            return found
        raise DTypeError(arg, value, "a dtype name such as 'float32', 'float16', 'bfloat16', 'tf32', "
                         "'float8_e4m3fn', 'int8' (or a NumPy/torch dtype)")

    @classmethod
    def _parse(cls, value: Any) -> "DType | None":
        key: str | None = None
        if isinstance(value, str):
            key = value
        elif isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
            key = np.dtype(value).name
        elif value is not None:
            key = str(value)  # torch.float16 -> "torch.float16"; cupy uses numpy dtypes
        if key is not None:
            key = key.strip().lower()
            for prefix in ("torch.", "numpy.", "np.", "jnp."):
                if key.startswith(prefix):
                    key = key[len(prefix):]
            return _ALIASES.get(key)
        return None

    def __str__(self) -> str:
        return self.value


_BITS = {DType.F64: 64, DType.F32: 32, DType.TF32: 32, DType.F16: 16, DType.BF16: 16,
         DType.FP8_E4M3: 8, DType.FP8_E5M2: 8, DType.INT8: 8, DType.INT32: 32}
_SHORT = {DType.F64: "f64", DType.F32: "f32", DType.TF32: "tf32", DType.F16: "f16", DType.BF16: "bf16",
          DType.FP8_E4M3: "e4m3", DType.FP8_E5M2: "e5m2", DType.INT8: "i8", DType.INT32: "i32"}
_ALIASES: dict[str, DType] = {}
_PARSED: dict[Any, DType] = {}  # memo of parse() on hashable inputs (dispatch parses dtypes every call)
for _d in DType:
    _ALIASES[_d.value] = _d
    _ALIASES[_d.short] = _d
    _ALIASES[_d.name.lower()] = _d
_ALIASES.update({
    "double": DType.F64, "float": DType.F32, "single": DType.F32, "fp32": DType.F32, "half": DType.F16,
    "fp16": DType.F16, "bfloat": DType.BF16, "fp64": DType.F64, "tensorfloat32": DType.TF32,
    "fp8_e4m3": DType.FP8_E4M3, "float8_e4m3": DType.FP8_E4M3, "e4m3fn": DType.FP8_E4M3,
    "fp8_e5m2": DType.FP8_E5M2, "e5m2": DType.FP8_E5M2, "i8": DType.INT8, "i32": DType.INT32,
})

# Module-level aliases, as in the seed's vocabulary (tracea.f32, tracea.bf16 ...).
f64, f32, tf32, f16, bf16 = DType.F64, DType.F32, DType.TF32, DType.F16, DType.BF16
fp8_e4m3, fp8_e5m2, int8, int32 = DType.FP8_E4M3, DType.FP8_E5M2, DType.INT8, DType.INT32


class Fp32Precision(enum.Enum):
    """How float32 matrix products may be computed, following ``torch.set_float32_matmul_precision``.

    ``HIGHEST``: float32 accuracy (SIMT fp32, or 3xTF32 split on Tensor Cores).
    ``HIGH``: TF32 Tensor Cores allowed (torch's ``allow_tf32 = True``).
    ``MEDIUM``: bf16 Tensor Cores allowed.
    """

    HIGHEST = "highest"
    HIGH = "high"
    MEDIUM = "medium"

    @classmethod
    def parse(cls, value: Any, arg: str = "fp32_precision") -> "Fp32Precision":
        """Accept an enum member, its name or value, or a bool (``True`` = TF32 allowed)."""
        if isinstance(value, Fp32Precision):
            return value
        if isinstance(value, bool):
            return cls.HIGH if value else cls.HIGHEST
        if isinstance(value, str):
            key = value.strip().lower()
            if key in ("tf32", "allow_tf32"):
                return cls.HIGH
            if key in ("ieee", "fp32", "strict"):
                return cls.HIGHEST
            for member in cls:
                if key == member.value:
                    return member
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(arg, value, "'highest', 'high' (TF32 allowed) or 'medium'")
