"""``tracea.Graph``: a list of ops tuned together (seed: ``graph.add_gemm(4096, 4096, 4096)``)."""

from __future__ import annotations

from typing import Any, Iterator

from .ir.ops import AttentionOp, Conv2dOp, GemmOp, Op, op_from_dict


class Graph:
    """An ordered collection of ops. ``Context.optimize_graph`` tunes them with one budget.

    Nodes are plain ops; identical ops are kept (they count towards a node's share of time) but tuned
    once.
    """

    def __init__(self, nodes: list[Op] | None = None, name: str = "graph") -> None:
        self.name = name
        self.nodes: list[Op] = list(nodes or [])

    def add(self, op: Op) -> Op:
        """Append an op and return it."""
        if not isinstance(op, Op):
            from .errors import InvalidArgumentError

            raise InvalidArgumentError("op", op, "a GemmOp, Conv2dOp or AttentionOp")
        self.nodes.append(op)
        return op

    def add_gemm(self, m: int, n: int, k: int, batch: int = 1, **kwargs: Any) -> GemmOp:
        """Append a GEMM (keyword arguments as :class:`GemmOp`: dtype_a, dtype_b, epilogue ...)."""
        if "dtype" in kwargs:
            dt = kwargs.pop("dtype")
            kwargs.setdefault("dtype_a", dt)
            kwargs.setdefault("dtype_b", dt)
        return self.add(GemmOp(m, n, k, batch, **kwargs))  # type: ignore[return-value]

    def add_conv2d(self, n: int, c: int, h: int, w: int, k: int, r: int, s: int | None = None,
                   **kwargs: Any) -> Conv2dOp:
        """Append a conv2d (``s`` defaults to ``r``; keywords as :class:`Conv2dOp`)."""
        return self.add(Conv2dOp(n, c, h, w, k, r, r if s is None else s, **kwargs))  # type: ignore[return-value]

    def add_attention(self, batch: int, heads: int, seq_q: int, seq_kv: int | None = None, head_dim: int = 64,
                      **kwargs: Any) -> AttentionOp:
        """Append an attention op (``seq_kv`` defaults to ``seq_q``)."""
        return self.add(AttentionOp(batch, heads, seq_q, seq_q if seq_kv is None else seq_kv, head_dim,
                                    **kwargs))  # type: ignore[return-value]

    def unique(self) -> dict[Op, int]:
        """Distinct ops with how many times each occurs."""
        out: dict[Op, int] = {}
        for op in self.nodes:
            out[op] = out.get(op, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": [op.to_dict() for op in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Graph":
        return cls([op_from_dict(n) for n in data.get("nodes", [])], name=data.get("name", "graph"))

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.nodes)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"
