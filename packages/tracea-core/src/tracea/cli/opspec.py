"""Parse op specs from the command line: ``gemm:m=1024,n=1024,k=1024,dtype=f16,epilogue=bias+gelu``,
``conv2d:n=8,c=64,h=56,w=56,k=64,r=3,padding=1``, ``attention:batch=1,heads=8,seq_q=512,head_dim=64``.
Also accepts space-separated ``key=value`` words after the kind. ``dtype=`` sets both GEMM input dtypes;
conv ``s`` defaults to ``r``, attention ``seq_kv`` to ``seq_q``; pairs are written ``2x2``."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import InvalidArgumentError
from ..ir.ops import OP_TYPES, Op


def parse_op(spec: str) -> Op:
    """Build an op from a spec string (see module doc)."""
    text = spec.strip()
    head = text.split(":", 1)[0]
    if ":" in text and "=" not in head and "," not in head:
        kind, rest = head, text.split(":", 1)[1]
    else:
        words = text.split()
        kind, rest = (words[0] if words else ""), ",".join(words[1:])
    rest = rest.replace(" ", ",")
    kind = kind.strip().lower()
    cls = OP_TYPES.get(kind)
    if cls is None:
        raise InvalidArgumentError("op", spec, "a spec starting with gemm:, conv2d: or attention:")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise InvalidArgumentError("op", item, "key=value")
        if kind == "gemm" and key == "dtype":
            values["dtype_a"] = values["dtype_b"] = value
            continue
        if key not in fields:
            raise InvalidArgumentError(key, value, f"a field of {kind}: " + ", ".join(fields))
        values[key] = _convert(key, value, fields[key])
    if kind == "conv2d" and "r" in values:
        values.setdefault("s", values["r"])
    if kind == "attention" and "seq_q" in values:
        values.setdefault("seq_kv", values["seq_q"])
    try:
        return cls(**values)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise InvalidArgumentError("op", spec, f"all required fields of {kind} ({exc})") from exc


def _convert(key: str, value: str, field: dataclasses.Field) -> Any:
    value = value.strip()
    if key in ("stride", "padding", "dilation"):
        parts = value.lower().split("x")
        return tuple(int(p) for p in parts) if len(parts) == 2 else int(parts[0])
    if value.lower() in ("true", "false", "yes", "no"):
        return value.lower() in ("true", "yes")
    if key == "scale":
        return float(value)
    if value.lstrip("-").isdigit():
        return int(value)
    return value
