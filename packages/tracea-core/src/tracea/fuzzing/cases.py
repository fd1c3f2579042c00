"""The seeded case generator: ``generate(seed, index)`` is a pure function, so any case replays alone
from its ``(seed, index)``.

A :class:`Case` is data (JSON-ready): the op, every array argument as an
:class:`~tracea.fuzzing.arrays.ArraySpec`, the other arguments (encoded, see :func:`decode`), what
Tracea must do with it (``expect``) and, for calls that have a result, the model the oracle computes
(``model``). ``expect`` is

* ``valid``: documented as supported; it must compute the right result (an error is a finding);
* ``invalid``: documented as an error (wrong shapes, dtypes, read-only ``out`` ...); it must raise a
  :class:`~tracea.errors.TraceaError` (a result is a finding, there is nothing to compare it with);
* ``either``: outside the documented contract but meaningful (empty arrays, Python lists, a negative
  attention scale, ``out`` aliasing an input ...): a TraceaError or the right result.

``notes`` say why a case is not ``valid``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .arrays import FLOAT_DTYPES, ArraySpec

OPS = ("matmul", "gemm", "conv2d", "attention")
#: share of generated cases per op (gemm is matmul with positional bias / epilogue).
OP_WEIGHTS = {"matmul": 0.38, "gemm": 0.1, "conv2d": 0.3, "attention": 0.22}
SEVERITY = {"valid": 0, "either": 1, "invalid": 2}
#: FLOP budget of most cases (a few get 4x): each case stays a few milliseconds.
FLOP_BUDGET = 50e6

SMALL = [1, 2, 3, 4, 5, 6, 7, 8]
PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 53, 61, 67, 97, 127, 131, 257]
ODD = [9, 15, 21, 25, 33, 63, 65, 99, 129, 255, 257, 511]
POW2 = [16, 32, 64, 128, 256]
ACTIVATIONS = ["relu", "gelu", "gelu_erf", "silu"]
BAD_DTYPES = ["int32", "bool", "complex64", "int8"]


@dataclass
class Case:
    """One generated call of a public op (see the module docstring)."""

    seed: int
    index: int
    op: str
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    expect: str = "valid"
    notes: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)

    def mark(self, expect: str, why: str) -> None:
        """Record why the case is not plainly valid; the most severe expectation wins."""
        if SEVERITY[expect] > SEVERITY[self.expect]:
            self.expect = expect
        self.notes.append(f"{expect}: {why}")

    def unmark(self, note: str) -> None:
        """Drop a note that no longer holds; the expectation is the most severe of those left."""
        self.notes = [n for n in self.notes if n != note]
        self.expect = max((n.split(":", 1)[0] for n in self.notes if n.split(":", 1)[0] in SEVERITY),
                          key=SEVERITY.__getitem__, default="valid")

    @property
    def kind(self) -> str:
        """The array kind of the first array argument."""
        first = next(iter(self.arrays.values()), None)
        return first.kind if first else "-"

    @property
    def dtype(self) -> str:
        first = next(iter(self.arrays.values()), None)
        return first.dtype if first else "-"

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "index": self.index, "op": self.op,
                "arrays": {k: v.to_dict() for k, v in self.arrays.items()}, "positional": list(self.positional),
                "kwargs": self.kwargs, "expect": self.expect, "notes": list(self.notes), "model": self.model}

    def call_text(self) -> str:
        """The call as Python, each array named and described in a comment line."""
        args = [n if n in self.arrays else (decode_text(self.kwargs[n]) if n in self.kwargs else "None")
                for n in self.positional]
        kw = [f"{n}={n}" for n in self.arrays if n not in self.positional]
        kw += [f"{k}={decode_text(v)}" for k, v in self.kwargs.items() if k not in self.positional]
        lines = [f"tracea.ops.{self.op}({', '.join(args + kw)})"]
        for n, spec in self.arrays.items():
            lines.append(f"#   {n}: {spec.describe()}")
        return "\n".join(lines)


def decode_text(value: Any) -> str:
    """Python text of an encoded argument value."""
    if isinstance(value, dict) and len(value) == 1:
        (tag, v), = value.items()
        if tag == "$epilogue":
            return "Epilogue.of(" + ", ".join(repr(s) for s in v) + ")"
        if tag == "$kind":
            return f"EpilogueKind({v!r})"
        if tag == "$float":
            return f"float({v!r})"
        if tag == "$np":
            return f"np.{v[0]}({v[1]!r})"
        if tag == "$tuple":
            return "(" + ", ".join(decode_text(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if tag == "$bytes":
            return repr(v.encode())
        if tag == "$dtype":
            return f"{v[0]}.{v[1]}"
    if isinstance(value, list):
        return "[" + ", ".join(decode_text(x) for x in value) + "]"
    return repr(value)


def decode(value: Any) -> Any:
    """The Python value of an encoded argument (``{"$epilogue": [...]}`` -> ``Epilogue`` ...)."""
    if isinstance(value, dict) and len(value) == 1:
        (tag, v), = value.items()
        if tag == "$epilogue":
            from ..ir.epilogue import Epilogue

            return Epilogue.of(*v)
        if tag == "$kind":
            from ..ir.epilogue import EpilogueKind

            return EpilogueKind(v)
        if tag == "$float":
            return float(v)
        if tag == "$np":
            import numpy as np

            return getattr(np, v[0])(v[1])
        if tag == "$tuple":
            return tuple(decode(x) for x in v)
        if tag == "$bytes":
            return v.encode()
        if tag == "$dtype":
            if v[0] == "torch":
                import torch

                return getattr(torch, v[1])
            import numpy as np

            return np.dtype(v[1])
    if isinstance(value, list):
        return [decode(x) for x in value]
    return value


class _G:
    """random.Random with the few helpers the generators use."""

    def __init__(self, seed: int, index: int) -> None:
        self.r = random.Random(f"tracea-fuzz:{seed}:{index}")

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def pick(self, seq: Any) -> Any:
        return self.r.choice(list(seq))

    def weighted(self, table: dict[Any, float]) -> Any:
        keys = list(table)
        return self.r.choices(keys, weights=[table[k] for k in keys])[0]

    def dim(self, hi: int = 300, zero: float = 0.015) -> int:
        if self.chance(zero):
            return 0
        cls = self.weighted({"small": 0.32, "prime": 0.3, "odd": 0.16, "pow2": 0.14, "any": 0.08})
        pool = {"small": SMALL, "prime": PRIMES, "odd": ODD, "pow2": POW2}.get(cls)
        value = self.pick(pool) if pool else self.r.randint(1, hi)
        return min(value, hi)


def generate(seed: int, index: int) -> Case:
    """The case at ``index`` of the stream of ``seed`` (deterministic)."""
    g = _G(seed, index)
    op = g.weighted(OP_WEIGHTS)
    case = Case(seed, index, op)
    {"matmul": _matmul, "gemm": _matmul, "conv2d": _conv2d, "attention": _attention}[op](g, case)
    return case


# ------------------------------------------------------------------------------------------------
# Shared pieces
# ------------------------------------------------------------------------------------------------

def _kind(g: _G) -> str:
    return g.weighted({"numpy": 0.5, "torch": 0.46, "list": 0.02, "scalar": 0.005, "mixed": 0.015})


def _dtype(g: _G, case: Case, kind: str) -> str:
    dt = g.weighted({"float32": 0.6, "float64": 0.11, "float16": 0.11, "bfloat16": 0.12, "bad": 0.06})
    if dt == "bad":
        dt = g.pick(BAD_DTYPES)
        case.mark("invalid", f"dtype {dt}")
    if dt == "bfloat16" and kind == "numpy":
        dt = "float32"  # NumPy bf16 needs ml_dtypes; bf16 is fuzzed through torch tensors
    return dt


def _view(g: _G, shape: tuple[int, ...], kind: str, *, out: bool = False) -> tuple[str, dict[str, Any]]:
    """A random memory layout for an array of ``shape``."""
    nd = len(shape)
    table = {"contig": 0.55, "transposed": 0.12, "fortran": 0.03, "sliced": 0.09, "reversed": 0.05,
             "overlap": 0.0 if out else 0.04, "expanded": 0.0 if out else 0.04, "unaligned": 0.03,
             "record": 0.02, "permuted": 0.03 if nd >= 3 else 0.0, "channels_last": 0.1 if nd == 4 else 0.0}
    if kind == "torch":
        for v in ("reversed", "unaligned", "record"):
            table[v] = 0.0
    if nd < 2:
        for v in ("transposed", "fortran"):
            table[v] = 0.0
    view = g.weighted(table)
    p: dict[str, Any] = {}
    if view == "sliced":
        p = {"steps": [g.pick([1, 2, 3]) if g.chance(0.6) else 1 for _ in range(nd)], "offset": g.pick([0, 1, 3])}
        if all(s == 1 for s in p["steps"]) and nd:
            p["steps"][-1] = 2
    elif view == "permuted":
        perm = list(range(nd))
        g.r.shuffle(perm)
        p = {"perm": perm}
    elif view in ("reversed", "expanded"):
        p = {"axis": g.r.randrange(max(nd, 1))}
    elif view == "overlap":
        axis = g.r.randrange(max(nd, 1))
        inner = math.prod(shape[axis + 1:]) if nd else 1
        p = {"axis": axis, "stride": g.r.randint(1, max(1, inner - 1)) if inner > 1 else g.pick([0, 1])}
    elif view == "unaligned":
        p = {"byte_shift": g.pick([1, 2, 3])}
    return view, p


def _array(g: _G, case: Case, shape: tuple[int, ...], dtype: str, kind: str, *, out: bool = False,
           special_ok: bool = True) -> ArraySpec:
    view, param = _view(g, shape, kind, out=out)
    spec = ArraySpec(tuple(shape), dtype, kind, view, param)
    if kind == "numpy" and not out and g.chance(0.04):
        spec.readonly = True
    if kind == "torch" and not out and dtype in FLOAT_DTYPES and g.chance(0.03):
        spec.requires_grad = True
    if spec.kind in ("list", "scalar"):
        spec.view, spec.param = "contig", {}
    if dtype == "float16":
        spec.scale = 0.5
    return spec


def _maybe_special(g: _G, case: Case, names: list[str], p: float = 0.08) -> None:
    """Inject NaN/Inf into one float input."""
    if not g.chance(p):
        return
    name = g.pick(names)
    spec = case.arrays.get(name)
    if spec is None or spec.dtype not in FLOAT_DTYPES or spec.kind == "scalar":
        return
    spec.special = g.weighted({"nan": 0.35, "inf": 0.25, "ninf": 0.15, "mix": 0.25})
    spec.nspecial = g.pick([1, 1, 2, 3, 8])
    case.notes.append(f"non-finite values in {name}")


def _zero_sizes(case: Case, specs: dict[str, tuple[int, ...]]) -> None:
    for name, shape in specs.items():
        if any(s == 0 for s in shape):
            case.mark("either", f"empty array {name} {shape}")


def _epilogue(g: _G, case: Case, has_bias: bool) -> list[str]:
    """Choose epilogue / activation arguments; return the steps Tracea must apply (bias implied)."""
    steps: list[str] = []
    form = g.weighted({"none": 0.38, "activation": 0.27, "string": 0.18, "object": 0.05, "list": 0.03,
                       "kind": 0.02, "both": 0.03, "bad": 0.04})
    act = g.pick(ACTIVATIONS)
    canon = {"gelu": "gelu_tanh"}
    if form == "activation":
        name = {"silu": g.pick(["silu", "swish"]), "relu": g.pick(["relu", "relu", "ReLU"])}.get(act, act)
        case.kwargs["activation"] = name
        steps = [canon.get(act, act)]
    elif form == "string":
        chain = [act] + ([g.pick(ACTIVATIONS)] if g.chance(0.2) else [])
        if has_bias and g.chance(0.6):
            chain = ["bias"] + chain if g.chance(0.8) else chain + ["bias"]
        case.kwargs["epilogue"] = g.pick(["+", ","]).join(chain) if len(chain) > 1 else chain[0]
        steps = [canon.get(s, s) for s in chain]
    elif form in ("object", "list"):
        chain = (["bias"] if has_bias and g.chance(0.5) else []) + [act]
        case.kwargs["epilogue"] = {"$epilogue": chain} if form == "object" else chain
        steps = [canon.get(s, s) for s in chain]
    elif form == "kind":
        case.kwargs["epilogue"] = {"$kind": canon.get(act, act)}
        steps = [canon.get(act, act)]
    elif form == "both":
        act2 = g.pick(ACTIVATIONS)
        case.kwargs["epilogue"] = act
        case.kwargs["activation"] = act2
        steps = [canon.get(act, act), canon.get(act2, act2)]
    elif form == "bad":
        bad = g.pick(["tanh", "relu6", "sigmoid", 3, 1.5, {"$bytes": "relu"}, ["relu", 3], "bias+bias",
                      "bias", "relu+bias+bias"])
        key = g.pick(["epilogue", "activation"])
        case.kwargs[key] = bad
        if bad == "bias" and has_bias:
            steps = ["bias"]
        else:
            case.mark("invalid", f"{key}={bad!r}")
    if has_bias and "bias" not in steps:
        steps = ["bias"] + steps
    if not has_bias and "bias" in steps:
        case.mark("invalid", "a bias step without a bias array")
    return steps


def _out_dtype(g: _G, case: Case, kind: str, dtype: str) -> str:
    """Maybe pass ``out_dtype``; return the output dtype implied (before ``out``)."""
    if not g.chance(0.08):
        return dtype
    choice = g.weighted({"float32": 0.3, "float64": 0.15, "float16": 0.15, "bfloat16": 0.15, "obj": 0.1,
                         "int32": 0.05, "tf32": 0.03, "nonsense": 0.07})
    if choice == "obj":
        target = g.pick(["float32", "float64", "float16"])
        case.kwargs["out_dtype"] = {"$dtype": ["torch" if kind == "torch" else "numpy", target]}
        return target
    case.kwargs["out_dtype"] = choice
    if choice == "int32":
        case.mark("invalid", "out_dtype int32")
        return dtype
    elif choice == "nonsense":
        case.kwargs["out_dtype"] = "float13"
        case.mark("invalid", "out_dtype float13")
        return dtype
    elif choice == "tf32":
        case.mark("either", "out_dtype tf32 (a compute mode)")
        return "float32"
    elif choice == "bfloat16" and kind != "torch":
        case.mark("either", "bf16 NumPy output needs ml_dtypes")
    return choice


def _precision(g: _G, case: Case, dtype: str) -> str:
    if not g.chance(0.08):
        return "highest"
    value = g.pick(["highest", "high", "medium", "tf32", True, False, "HIGH", "low", 3])
    case.kwargs["fp32_precision"] = value
    if value in ("low", 3):
        case.mark("invalid", f"fp32_precision={value!r}")
        return "highest"
    return {True: "high", False: "highest", "tf32": "high", "HIGH": "high"}.get(value, value)


def _out(g: _G, case: Case, shape: tuple[int, ...], dtype: str, kind: str, inputs: list[str],
         dtype_given: bool, same_dtype_only: bool = False) -> str:
    """Maybe pass ``out=``; return the output dtype implied."""
    if not g.chance(0.15):
        return dtype
    flavour = g.weighted({"right": 0.45, "other_dtype": 0.08, "wrong_shape": 0.08, "wrong_dtype": 0.06,
                          "alias": 0.1, "readonly": 0.05, "expanded": 0.05, "overlap": 0.03, "kind": 0.04,
                          "list": 0.02, "grad": 0.04})
    out_dtype = dtype
    okind = kind if kind in ("numpy", "torch") else "numpy"
    spec = _array(g, case, shape, dtype, okind, out=True)
    if flavour == "other_dtype":
        other = g.pick([d for d in ("float32", "float64", "float16") if d != dtype])
        spec.dtype = other
        if dtype_given or same_dtype_only:
            case.mark("invalid", "out dtype differs from the output dtype")
        else:
            out_dtype = other
    elif flavour == "wrong_shape":
        bad = list(shape)
        i = g.r.randrange(len(bad))
        bad[i] = bad[i] + g.pick([1, -1]) if bad[i] > 1 else bad[i] + 1
        spec.shape = tuple(bad)
        spec.view, spec.param = "contig", {}
        case.mark("invalid", f"out shape {tuple(bad)} instead of {tuple(shape)}")
    elif flavour == "wrong_dtype":
        spec.dtype = g.pick(["int32", "bool"] if kind != "list" else ["int32"])
        case.mark("invalid", f"out dtype {spec.dtype}")
    elif flavour == "alias":
        target = g.pick(inputs)
        src = case.arrays[target]
        if src.kind in ("numpy", "torch") and src.kind == okind and src.dtype == dtype:
            spec.view, spec.param = "contig", {}
            spec.share = target
            spec.share_offset = g.pick([0, 0, 1, max(0, math.prod(src.shape) // 2)])
            case.mark("either", f"out aliases input {target}")
    elif flavour == "readonly":
        if okind == "numpy":
            spec.readonly = True
            case.mark("invalid", "read-only out")
    elif flavour == "grad":
        if okind == "torch" and dtype in FLOAT_DTYPES:
            spec.requires_grad = True
            case.mark("invalid", "out requires grad")
    elif flavour in ("expanded", "overlap"):
        nd = len(shape)
        axis = next((i for i in range(nd) if shape[i] > 1), None)
        if axis is not None:
            inner = math.prod(shape[axis + 1:])
            stride = 0 if flavour == "expanded" else (g.r.randint(1, inner - 1) if inner > 1 else 0)
            spec.view, spec.param = "overlap", {"axis": axis, "stride": stride}
            case.mark("invalid", f"out with self-overlapping elements ({flavour})")
    elif flavour == "kind":
        spec.kind = "numpy" if okind == "torch" else "torch"
        spec.view = "contig" if spec.view in ("reversed", "unaligned", "record") else spec.view
        case.mark("invalid", "out of another array kind")
    elif flavour == "list":
        spec.kind = "list"
        spec.view, spec.param = "contig", {}
        case.mark("invalid", "out is a Python list")
    if spec.dtype not in FLOAT_DTYPES:
        case.mark("invalid", f"out dtype {spec.dtype}")
    if spec.dtype == "bfloat16" and spec.kind == "numpy":
        spec.dtype = "float32"
    case.arrays["out"] = spec
    return out_dtype if spec.dtype in FLOAT_DTYPES else dtype


def _maybe_variant(g: _G, case: Case, p: float = 0.07) -> None:
    """Sometimes pin ``variant=`` (documented for tests and experiments): reaches the AVX2 and scalar
    kernels a machine with AVX-512 never chooses. A variant that rejects the call raises."""
    if not g.chance(p):
        return
    kind = "gemm" if case.op in ("matmul", "gemm") else case.op
    names = [f"cpu.{kind}.{isa}" for isa in ("avx512", "avx2", "scalar", "avx2", "scalar", "neon")]
    names += [f"reference.{kind}", "no.such.variant"] + (["cpu.gemm.avx512bf16"] if kind == "gemm" else [])
    case.kwargs["variant"] = g.pick(names)
    case.mark("either", f"variant={case.kwargs['variant']!r} pinned (refused when it rejects the call)")


def _mixed(g: _G, case: Case, names: list[str]) -> None:
    """Make one argument of another array kind (documented as an error)."""
    main = case.kind
    candidates = [n for n in names if n in case.arrays and case.arrays[n].kind == main]
    if main not in ("numpy", "torch") or not candidates:
        return
    name = g.pick(candidates)
    spec = case.arrays[name]
    spec.kind = "numpy" if main == "torch" else "torch"
    spec.share = None
    if spec.view in ("reversed", "unaligned", "record"):
        spec.view, spec.param = "contig", {}
    if spec.kind == "numpy" and spec.dtype == "bfloat16":
        spec.dtype = "float32"
    spec.requires_grad = False
    case.mark("invalid", f"{name} is of another array kind")


def _mixed_dtype(g: _G, case: Case, names: list[str]) -> None:
    name = g.pick(names)
    spec = case.arrays[name]
    other = [d for d in ("float32", "float64", "float16") if d != spec.dtype]
    spec.dtype = g.pick(other)
    case.mark("invalid", f"{name} has another dtype")


def _budget(dims: list[int], flops: Any, budget: float) -> list[int]:
    """Halve the largest dims until ``flops(dims)`` fits the budget."""
    dims = list(dims)
    while flops(dims) > budget:
        i = max(range(len(dims)), key=lambda j: dims[j])
        if dims[i] <= 1:
            break
        dims[i] = (dims[i] + 1) // 2
    return dims


def _int_arg(g: _G, case: Case, name: str, value: Any, positive: bool) -> Any:
    """An int-or-pair argument in one of its accepted spellings, or (sometimes) a bad one."""
    a, b = value
    form = g.weighted({"int": 0.4 if a == b else 0.0, "tuple": 0.3, "list": 0.15, "np": 0.07, "bad": 0.08})
    if form == "int":
        return a
    if form == "tuple":
        return {"$tuple": [a, b]}
    if form == "list":
        return [a, b]
    if form == "np":
        return {"$tuple": [{"$np": ["int64", a]}, {"$np": ["int32", b]}]}
    bad = g.pick(["zero", "neg", "triple", "str", "float", "float_pair", "bool"] + (["same"] if name == "padding" else []))
    if bad == "zero" and not positive:
        bad = "neg"
    case.mark("either" if bad == "same" else "invalid", f"{name} {bad}")
    return {"zero": 0, "neg": -1, "triple": {"$tuple": [a, b, 1]}, "str": str(a), "float": a + 0.5,
            "float_pair": {"$tuple": [a + 0.5, b]}, "bool": True, "same": "same"}[bad]


# ------------------------------------------------------------------------------------------------
# matmul / gemm
# ------------------------------------------------------------------------------------------------

def _matmul(g: _G, case: Case) -> None:
    kind = _kind(g)
    mixed = kind == "mixed"
    if mixed:
        kind = g.pick(["numpy", "torch"])
    if kind in ("list", "scalar"):
        case.mark("either" if kind == "list" else "invalid", f"{kind} arguments")
    dtype = _dtype(g, case, kind)
    mode = g.weighted({"2d": 0.6, "3d2d": 0.15, "3d3d": 0.2, "bad": 0.05})
    budget = FLOP_BUDGET * (4 if g.chance(0.03) else 1)
    batch = g.pick([1, 2, 3, 5, 7]) if mode in ("3d2d", "3d3d") else 1
    if mode != "2d" and g.chance(0.01):
        batch = 0
    m, n, k = g.dim(), g.dim(), g.dim()
    batch, m, n, k = _budget([batch, m, n, k], lambda d: 2 * max(d[0], 1) * max(d[1], 1) * max(d[2], 1) * max(d[3], 1), budget)
    a_shape: tuple[int, ...] = (m, k)
    b_shape: tuple[int, ...] = (k, n)
    out_shape: tuple[int, ...] = (m, n)
    if mode == "3d2d":
        a_shape, out_shape = (batch, m, k), (batch, m, n)
    elif mode == "3d3d":
        a_shape, b_shape, out_shape = (batch, m, k), (batch, k, n), (batch, m, n)
    elif mode == "bad":
        bad = g.pick(["k", "batch", "2d3d", "1d", "4d"])
        if bad == "k":
            b_shape = (k + 1, n)
        elif bad == "batch":
            a_shape, b_shape = (2, m, k), (3, k, n)
        elif bad == "2d3d":
            b_shape = (2, k, n)
        elif bad == "1d":
            a_shape = (k,)
        else:
            a_shape = (2, 1, m, k)
        case.mark("invalid", f"matmul shapes {a_shape} @ {b_shape}")
    _zero_sizes(case, {"a": a_shape, "b": b_shape})
    case.arrays["a"] = _array(g, case, a_shape, dtype, kind)
    case.arrays["b"] = _array(g, case, b_shape, dtype, kind)
    case.positional = ["a", "b"]
    has_bias = g.chance(0.35)
    if has_bias:
        case.arrays["bias"] = _bias(g, case, n, dtype, kind)
    steps = _epilogue(g, case, has_bias)
    if case.op == "gemm" and (has_bias or "epilogue" in case.kwargs):  # gemm(a, b, bias, epilogue)
        case.positional.append("bias")
        if "epilogue" in case.kwargs:
            case.positional.append("epilogue")
    out_dtype = _out_dtype(g, case, kind, dtype)
    precision = _precision(g, case, dtype)
    out_dtype = _out(g, case, out_shape, out_dtype, kind, ["a", "b"] + (["bias"] if has_bias else []),
                     "out_dtype" in case.kwargs)
    _maybe_special(g, case, ["a", "b", "a", "b", "bias"])
    if mixed:
        _mixed(g, case, ["b", "bias", "out", "a"])
    elif g.chance(0.02):
        _mixed_dtype(g, case, ["b"])
    _maybe_variant(g, case)
    case.model = {"steps": steps, "out_dtype": out_dtype, "precision": precision, "k": k}


def _bias(g: _G, case: Case, length: int, dtype: str, kind: str, name: str = "bias") -> ArraySpec:
    flavour = g.weighted({"right": 0.86, "long": 0.03, "short": 0.02, "2d": 0.03, "list": 0.02,
                          "other_float": 0.02, "int": 0.02})
    shape: tuple[int, ...] = (length,)
    bdtype = dtype
    bkind = kind
    if flavour == "long":
        shape = (length + 1,)
        case.mark("invalid", f"{name} length {length + 1} instead of {length}")
    elif flavour == "short" and length > 1:
        shape = (length - 1,)
        case.mark("invalid", f"{name} length {length - 1} instead of {length}")
    elif flavour == "2d":
        shape = (1, length)
        case.mark("invalid", f"2-D {name}")
    elif flavour == "list":
        bkind = "list"
        if kind != "list":
            case.mark("either", f"{name} is a Python list")
    elif flavour == "other_float" and dtype in FLOAT_DTYPES:
        bdtype = g.pick([d for d in ("float32", "float64", "float16") if d != dtype])
    elif flavour == "int":
        bdtype = "int32"
        case.mark("either", f"{name} of dtype int32")
    if bkind == "numpy" and bdtype == "bfloat16":
        bdtype = "float32"
    return _array(g, case, shape, bdtype, bkind)


# ------------------------------------------------------------------------------------------------
# conv2d
# ------------------------------------------------------------------------------------------------

def _conv2d(g: _G, case: Case) -> None:
    kind = _kind(g)
    mixed = kind == "mixed"
    if mixed:
        kind = g.pick(["numpy", "torch"])
    if kind in ("list", "scalar"):
        case.mark("either" if kind == "list" else "invalid", f"{kind} arguments")
    dtype = _dtype(g, case, kind)
    n = g.pick([1, 1, 1, 2, 2, 3, 4]) if not g.chance(0.01) else 0
    groups_mode = g.weighted({"one": 0.72, "grouped": 0.13, "depthwise": 0.1, "bad": 0.05})
    cg = g.pick([1, 2, 3, 4, 5, 7, 8, 16, 3, 1, 24])  # (24, 32: RegNet / ResNeXt group widths)
    kg = g.pick([1, 2, 3, 4, 5, 6, 8, 16, 13, 32])
    groups = 1
    if groups_mode == "grouped":
        groups = g.pick([2, 3, 4])
    elif groups_mode == "depthwise":
        groups, cg, kg = g.pick([2, 3, 4, 8, 16]), 1, g.pick([1, 1, 2])
    c, kk = cg * groups, kg * groups
    r, s = g.pick([(1, 1), (3, 3), (3, 3), (2, 2), (5, 5), (1, 7), (7, 1), (3, 1), (4, 4), (7, 7)])
    h, w = g.pick([1, 2, 3, 5, 7, 8, 9, 13, 14, 16, 17, 23, 28, 31]), g.pick([1, 2, 3, 5, 7, 8, 11, 14, 16, 19, 28])
    stride = (g.pick([1, 1, 1, 2, 2, 3]), g.pick([1, 1, 1, 2, 3]))
    if g.chance(0.03):
        stride = (g.pick([50, 1000]), stride[1])
    padding = (g.pick([0, 0, 1, 1, 2, 3]), g.pick([0, 0, 1, 1, 2]))
    if g.chance(0.05):
        padding = (r + g.pick([0, 1, 3]), s + 1)  # wider than the kernel
    dilation = (g.pick([1, 1, 1, 2, 3]), g.pick([1, 1, 2]))
    for axis, size in ((0, h), (1, w)):
        ker = (r, s)[axis]
        while size + 2 * padding[axis] < dilation[axis] * (ker - 1) + 1:
            if dilation[axis] > 1:
                dilation = (1, dilation[1]) if axis == 0 else (dilation[0], 1)
            else:
                padding = ((ker // 2 + 1, padding[1]) if axis == 0 else (padding[0], ker // 2 + 1))
    if g.chance(0.02):
        dilation = (h + 2 * padding[0] + 1, dilation[1]) if r > 1 else dilation
        if r > 1:
            case.mark("invalid", "dilated kernel larger than the padded input")

    def out_hw(h_: int, w_: int) -> tuple[int, int]:
        p_ = (h_ + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
        q_ = (w_ + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
        return max(p_, 0), max(q_, 0)

    def flops(d: list[int]) -> float:
        p_, q_ = out_hw(h, w)
        return 2.0 * max(d[0], 1) * kk * p_ * q_ * cg * r * s

    n = _budget([n], flops, FLOP_BUDGET)[0]
    while flops([n]) > FLOP_BUDGET and (h > 8 or w > 8):
        h, w = max(8, h // 2), max(8, w // 2)
    if groups_mode == "bad":
        c = c + 1 if groups > 1 else c
        groups = groups if groups > 1 else g.pick([2, 3])
        if c % groups == 0:
            c += 1
        case.mark("invalid", f"groups={groups} does not divide C={c}")
    layout = "NCHW"
    if kind in ("numpy", "list") and g.chance(0.3):
        layout = "NHWC"
    x_shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    w_shape = (kk, c // groups if c % groups == 0 else cg, r, s)
    if layout == "NHWC":
        w_shape = (kk, r, s, w_shape[1])
    if g.chance(0.03):
        x_shape = x_shape[1:]  # type: ignore[assignment]
        # unbatched input: F.conv2d's (C, H, W) form, accepted since the drop-in signatures; "either"
        # because a layout or out= the unbatched form cannot carry may still be refused
        case.mark("either", "3-D (unbatched) conv input")
    _zero_sizes(case, {"x": x_shape, "w": w_shape})
    case.arrays["x"] = _array(g, case, x_shape, dtype, kind)
    if kind == "torch" and len(x_shape) == 4 and g.chance(0.25):
        case.arrays["x"].view, case.arrays["x"].param = "channels_last", {}
    case.arrays["w"] = _array(g, case, w_shape, dtype, kind)
    case.positional = ["x", "w"]
    has_bias = g.chance(0.35)
    if has_bias:
        case.arrays["b"] = _bias(g, case, kk, dtype, kind, "b")
        if g.chance(0.5):
            case.positional.append("b")
    case.kwargs["stride"] = _int_arg(g, case, "stride", stride, True)
    case.kwargs["padding"] = _int_arg(g, case, "padding", padding, False)
    case.kwargs["dilation"] = _int_arg(g, case, "dilation", dilation, True)
    if case.kwargs["padding"] == "same":  # F.conv2d's 'same': the model needs the padding it means
        totals = (dilation[0] * (r - 1), dilation[1] * (s - 1))
        if stride == (1, 1) and totals[0] % 2 == 0 and totals[1] % 2 == 0:
            padding = (totals[0] // 2, totals[1] // 2)
            case.unmark("invalid: dilated kernel larger than the padded input")  # 'same' always fits
        else:  # strided (refused, as by PyTorch) or asymmetric: the model cannot hold it
            case.kwargs["padding"] = {"$tuple": list(padding)}
    if groups != 1 or g.chance(0.2):
        case.kwargs["groups"] = groups
    if g.chance(0.03):
        bad = g.pick([0, -1, True, 2.0, {"$np": ["int64", groups]}])
        case.kwargs["groups"] = bad
        if isinstance(bad, dict):
            case.kwargs["groups"] = {"$np": ["int64", groups]}  # a NumPy integer: accepted
        else:
            case.mark("invalid", f"groups={bad!r}")
    if layout == "NHWC":
        case.kwargs["layout"] = g.pick(["NHWC", "nhwc", "channels_last"])
    elif g.chance(0.1):
        case.kwargs["layout"] = g.pick(["NCHW", "nchw"])
    if g.chance(0.02):  # (NHWC names the NumPy arrays' order, so it is only wrong for torch tensors)
        case.kwargs["layout"] = g.pick(["NCWH", 3] + (["NHWC", "channels_last"] if kind == "torch" else []))
        case.mark("invalid", f"layout={case.kwargs['layout']!r}" + (" with torch tensors" if kind == "torch" else ""))
    steps = _epilogue(g, case, has_bias)
    out_dtype = _out_dtype(g, case, kind, dtype)
    precision = _precision(g, case, dtype)
    p_, q_ = out_hw(h, w)
    out_shape = (n, kk, p_, q_) if layout == "NCHW" else (n, p_, q_, kk)
    out_dtype = _out(g, case, out_shape, out_dtype, kind, ["x", "w"] + (["b"] if has_bias else []),
                     "out_dtype" in case.kwargs)
    _maybe_special(g, case, ["x", "w", "x", "b"])
    if mixed:
        _mixed(g, case, ["w", "b", "out", "x"])
    elif g.chance(0.02):
        _mixed_dtype(g, case, ["w"])
    _maybe_variant(g, case)
    case.model = {"steps": steps, "out_dtype": out_dtype, "precision": precision, "stride": list(stride),
                  "padding": list(padding), "dilation": list(dilation), "groups": groups, "layout": layout,
                  "k": cg * r * s}


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------

def _attention_shapes_valid(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> bool:
    """What ``tracea.ops.attention`` accepts (as ``F.scaled_dot_product_attention``): 3-D or more, head
    dims alike, k and v alike in kv heads and keys, kv heads dividing q's heads (or q's one head
    broadcast), leading dimensions broadcasting against each other."""
    if min(len(q), len(k), len(v)) < 3 or k[-1] != q[-1] or v[-3:-1] != k[-3:-1]:
        return False
    if q[-3] % k[-3] and q[-3] != 1:
        return False
    leads = [q[:-3], k[:-3], v[:-3]]
    n = max(len(x) for x in leads)
    for i in range(n):
        sizes = {x[len(x) - n + i] for x in leads if len(x) - n + i >= 0} - {1}
        if len(sizes) > 1:
            return False
    return True


def _attention(g: _G, case: Case) -> None:
    kind = _kind(g)
    mixed = kind == "mixed"
    if mixed:
        kind = g.pick(["numpy", "torch"])
    if kind in ("list", "scalar"):
        case.mark("either" if kind == "list" else "invalid", f"{kind} arguments")
    dtype = _dtype(g, case, kind)
    rank = g.weighted({4: 0.85, 3: 0.12, 2: 0.015, 5: 0.015})
    b = g.pick([1, 1, 2, 3])
    hq = g.pick([1, 2, 3, 4, 6, 8])
    hk = g.pick([d for d in range(1, hq + 1) if hq % d == 0]) if g.chance(0.3) else hq
    sq, skv = g.dim(130, zero=0.01), g.dim(130, zero=0.01)
    if g.chance(0.3):
        skv = sq
    d = g.pick([1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 80, 96, 128, 129])
    b, sq, skv = _budget([b, sq, skv], lambda x: 4.0 * max(x[0], 1) * hq * max(x[1], 1) * max(x[2], 1) * d, FLOP_BUDGET)
    q_shape: tuple[int, ...] = (b, hq, sq, d)
    k_shape: tuple[int, ...] = (b, hk, skv, d)
    v_shape = k_shape
    if rank == 3:
        q_shape, k_shape, v_shape = q_shape[1:], k_shape[1:], v_shape[1:]
    elif rank in (2, 5):
        q_shape = (sq, d) if rank == 2 else (1,) + q_shape
        k_shape = v_shape = (skv, d) if rank == 2 else (1,) + k_shape
        if rank == 2:
            case.mark("invalid", "2-D attention inputs")
    if g.chance(0.06):
        bad = g.pick(["d", "batch", "heads", "v", "rank"])
        if bad == "d":
            k_shape = v_shape = k_shape[:-1] + (d + 1,)
        elif bad == "batch" and len(q_shape) == 4:
            k_shape = v_shape = (b + 1,) + k_shape[1:]
        elif bad == "heads" and hq > 1:
            k_shape = v_shape = k_shape[:-3] + (hq + 1,) + k_shape[-2:]
        elif bad == "v":
            v_shape = v_shape[:-2] + (v_shape[-2] + 1, v_shape[-1])
        else:
            k_shape = v_shape = (1,) + k_shape if len(k_shape) == 3 else k_shape[1:]
        if not _attention_shapes_valid(q_shape, k_shape, v_shape):
            case.mark("invalid", f"attention shapes q{q_shape} k{k_shape} v{v_shape}")
    _zero_sizes(case, {"q": q_shape, "k": k_shape, "v": v_shape})
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        case.arrays[name] = _array(g, case, shape, dtype, kind)
    case.positional = ["q", "k", "v"]
    causal = g.chance(0.4)
    if causal or g.chance(0.2):
        case.kwargs["causal"] = g.pick([causal, causal, int(causal), {"$np": ["bool_", causal]}])
    scale = None
    form = g.weighted({"none": 0.6, "positive": 0.28, "odd": 0.12})
    if form == "positive":
        scale = g.pick([0.01, 0.1, 0.125, 0.5, 1.0, 2.0, 1])
        case.kwargs["scale"] = scale
    elif form == "odd":
        odd = g.pick([0.0, -0.5, -1.0, {"$float": "nan"}, {"$float": "inf"}, True, "0.5", 1e-30, 1e3])
        case.kwargs["scale"] = odd
        if isinstance(odd, str):
            case.mark("invalid", "scale is a string")
        elif isinstance(odd, bool):
            case.mark("either", "scale=True")
            scale = 1.0
        elif isinstance(odd, dict):
            case.mark("either", f"scale={odd['$float']}")
            scale = float(odd["$float"])
        else:
            if odd <= 0:
                case.mark("either", f"scale={odd}")
            scale = odd
    out_shape = q_shape
    if _attention_shapes_valid(q_shape, k_shape, v_shape):  # leading dims and a one-head q broadcast
        lead = np.broadcast_shapes(q_shape[:-3], k_shape[:-3], v_shape[:-3])
        out_shape = tuple(lead) + (max(q_shape[-3], k_shape[-3]), q_shape[-2], v_shape[-1])
    _out(g, case, out_shape, dtype, kind, ["q", "k", "v"], False, same_dtype_only=True)
    _maybe_special(g, case, ["q", "k", "v"], p=0.07)
    if mixed:
        _mixed(g, case, ["k", "v", "out", "q"])
    elif g.chance(0.02):
        _mixed_dtype(g, case, ["k", "v"])
    _maybe_variant(g, case)
    case.model = {"causal": bool(causal), "scale": scale, "out_dtype": dtype, "k": d}
