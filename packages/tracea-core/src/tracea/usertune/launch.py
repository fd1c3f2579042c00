"""Kernel Tuner's launch conventions: problem size, grid divisors, the defines prepended to the source.

- ``problem_size``: an int, a string, a tuple of up to three ints/strings (strings are expressions over
  the tunable parameters) or a callable of the parameter dict.
- grid: ``ceil(problem_size[d] / divisor[d])`` where ``grid_div_{x,y,z}`` is an int, a string
  expression, a callable or a list of those multiplied together; unset, x/y/z divide by the thread
  block dimension of that axis (``block_size_names``; defaults ``block_size_x/y/z``).
- source: unless ``defines`` is given, every instance gets ``#define`` lines for ``grid_size_x/y/z``,
  the block sizes, every tunable parameter and ``kernel_tuner 1``, then ``#line 1``.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import InvalidArgumentError
from .space import DEFAULT_BLOCK_NAMES

_TOKEN = re.compile(r"([A-Za-z0-9_]+)")


def substitute(text: str, params: Mapping[str, Any]) -> str:
    """``text`` with every token that names a parameter replaced by its value."""
    return "".join(str(params[p]) if p in params else p for p in _TOKEN.split(text))


def _eval_int(text: str, params: Mapping[str, Any], arg: str) -> int:
    try:
        return int(eval(substitute(text, params), {"__builtins__": {}}, {}))  # noqa: S307 - user's own expression
    except Exception as exc:  # noqa: BLE001
        raise InvalidArgumentError(arg, text, f"an integer expression over the tunable parameters ({exc})") from None


def problem_dims(problem_size: Any, params: Mapping[str, Any]) -> tuple[int, int, int]:
    """The problem size of one instance, padded to three dimensions with ones."""
    ps = problem_size(dict(params)) if callable(problem_size) else problem_size
    if isinstance(ps, (str, int)) or (hasattr(ps, "dtype") and getattr(ps, "ndim", 1) == 0):
        ps = (ps,)
    try:
        items = list(ps)
    except TypeError:
        raise InvalidArgumentError("problem_size", problem_size, "an int, a string or a tuple of up to 3") from None
    if not 1 <= len(items) <= 3:
        raise InvalidArgumentError("problem_size", problem_size, "1 to 3 dimensions")
    out = [1, 1, 1]
    for i, s in enumerate(items):
        if isinstance(s, str):
            out[i] = _eval_int(s, params, "problem_size")
        elif isinstance(s, bool) or not isinstance(s, int) and not (hasattr(s, "dtype") and s.dtype.kind in "iu"):
            raise InvalidArgumentError("problem_size", problem_size, "ints or string expressions")
        else:
            out[i] = int(s)
        if out[i] < 0:
            raise InvalidArgumentError("problem_size", problem_size, "non-negative sizes")
    return (out[0], out[1], out[2])


def _divisor(div: Any, default_name: str, params: Mapping[str, Any], arg: str) -> int:
    if div is None:
        return int(params.get(default_name, 1))
    if isinstance(div, bool):
        raise InvalidArgumentError(arg, div, "an int, a string, a callable or a list of those")
    if isinstance(div, int):
        return div
    if isinstance(div, str):
        return _eval_int(div, params, arg)
    if callable(div):
        return int(div(dict(params)))
    if isinstance(div, (list, tuple)):
        return math.prod(_divisor(d, "", params, arg) if d is not None else 1 for d in div)
    raise InvalidArgumentError(arg, div, "an int, a string, a callable or a list of those")


def grid_dims(problem: tuple[int, int, int], params: Mapping[str, Any], grid_div: Sequence[Any],
              block_size_names: Sequence[str]) -> tuple[int, int, int]:
    """Thread blocks per axis: ``ceil(problem / divisor)``."""
    names = list(block_size_names) + list(DEFAULT_BLOCK_NAMES[len(block_size_names):])
    out = []
    for i, axis in enumerate("xyz"):
        d = _divisor(grid_div[i], names[i], params, f"grid_div_{axis}")
        if d <= 0:
            raise InvalidArgumentError(f"grid_div_{axis}", grid_div[i], f"a positive divisor (got {d} for {dict(params)})")
        out.append(max(1, -(-problem[i] // d)) if problem[i] else 1)
    return (out[0], out[1], out[2])


def looks_like_filename(source: str) -> bool:
    """Kernel Tuner's test: short, no code punctuation, a kernel file suffix."""
    if len(source) > 250 or any(c in source for c in "();{}\\\n"):
        return False
    if any(s in source for s in ("__global__ ", "__kernel ", "void ", "float ")):
        return False
    return any(s in source for s in (".c", ".cu", ".cl", ".opencl", ".h"))


def source_text(kernel_source: Any, params: Mapping[str, Any] | None) -> str:
    """The kernel code: a string of code, a file name (str or Path), or a generator callable(params)."""
    if callable(kernel_source) and not hasattr(kernel_source, "run"):  # a Triton JITFunction has .run
        text = kernel_source(dict(params or {}))
        if not isinstance(text, str):
            raise InvalidArgumentError("kernel_source", kernel_source, "a generator returning the code as a string")
        return text
    if isinstance(kernel_source, Path):
        return _read(kernel_source)
    if isinstance(kernel_source, (list, tuple)) and kernel_source:  # Kernel Tuner: main file first, helpers after
        return source_text(kernel_source[0], params)
    if isinstance(kernel_source, str):
        if looks_like_filename(kernel_source):
            if os.path.isfile(kernel_source):
                return _read(Path(kernel_source))
            raise InvalidArgumentError("kernel_source", kernel_source, "an existing file or the kernel's code")
        return kernel_source
    raise InvalidArgumentError("kernel_source", kernel_source, "the code as a string, a file name, or a generator function")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError("kernel_source", str(path), f"a readable file ({exc.strerror})") from None


def prepare_source(name: str, text: str, params: Mapping[str, Any], grid: tuple[int, int, int],
                   block: tuple[int, int, int], block_size_names: Sequence[str], lang: str,
                   defines: Mapping[str, Any] | None) -> tuple[str, str]:
    """(kernel name with parameters substituted, source with the instance's defines prepended)."""
    if defines is None:
        names = list(block_size_names) + list(DEFAULT_BLOCK_NAMES[len(block_size_names):])
        table: dict[str, Any] = {f"grid_size_{a}": g for a, g in zip("xyz", grid)}
        table.update({names[i]: block[i] for i in range(3)})
        table.update(params)
        table["kernel_tuner"] = 1
    else:
        if not isinstance(defines, Mapping):
            raise InvalidArgumentError("defines", defines, "a dict of macro name -> value, string or callable(params)")
        table = dict(defines)
    lines = []
    for k, v in table.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise InvalidArgumentError("defines", k, "identifier macro names")
        if callable(v):
            v = v(dict(params))
        elif isinstance(v, str):
            v = substitute(v, params)
        v = str(v).replace("\n", "\\\n")
        if "loop_unroll_factor" in k and lang == "CUDA":  # an integer constant for #pragma unroll, as Kernel Tuner does
            if v == "0":
                text = re.sub(r"\n\s*#pragma\s+unroll\s+" + k, "\n", text)
            else:
                lines.append(f"constexpr int {k} = {v};")
        else:
            lines.append(f"#define {k} {v}")
    prefix = "\n".join(lines) + "\n#line 1\n" if lines else ""
    return substitute(name, params), prefix + text


_SIG_CACHE: dict[tuple[str, str], list[str] | None] = {}


def kernel_parameters(text: str, name: str) -> list[str] | None:
    """The parameter declarations of function ``name`` in ``text`` (best effort; None if not found)."""
    key = (name, text)
    if key in _SIG_CACHE:
        return _SIG_CACHE[key]
    found = None
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", text):
        before = text[max(0, m.start() - 200):m.start()]
        if not re.search(r"(void|float|double|int|__kernel|__global__|\))\s*[\w\s\*&<>,:]*$", before):
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        inner = text[m.end():i - 1]
        if text[i:].lstrip()[:1] not in ("{",):
            continue  # a call or a declaration, not the definition
        inner = re.sub(r"/\*.*?\*/|//[^\n]*", "", inner, flags=re.S).strip()
        found = [] if inner in ("", "void") else [p.strip() for p in _split_top(inner)]
        break
    if len(_SIG_CACHE) > 256:
        _SIG_CACHE.clear()
    _SIG_CACHE[key] = found
    return found


def _split_top(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def check_against_signature(arguments: Sequence[Any], text: str, name: str, is_array: Callable[[Any], bool]) -> None:
    """Arguments must match the kernel's parameters in number, pointer (array) vs value (scalar)."""
    decls = kernel_parameters(text, name)
    if decls is None:
        return
    if len(decls) != len(arguments):
        raise InvalidArgumentError("arguments", f"{len(arguments)} arguments",
                                   f"{len(decls)} arguments as kernel {name} declares ({', '.join(decls)})")
    for i, (decl, arg) in enumerate(zip(decls, arguments)):
        pointer = "*" in decl or "[" in decl
        if pointer and not is_array(arg):
            raise InvalidArgumentError(f"arguments[{i}]", arg, f"an array for parameter '{decl}'")
        if not pointer and is_array(arg) and "&" not in decl and not _is_vector_value(decl):
            raise InvalidArgumentError(f"arguments[{i}]", arg, f"a NumPy scalar (np.int32, np.float32 ...) for parameter '{decl}'")


def _is_vector_value(decl: str) -> bool:
    return bool(re.search(r"\b(float|int|double|half)[2348]\b", decl))
