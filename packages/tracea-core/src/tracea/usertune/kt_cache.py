"""Kernel Tuner's JSON cache file (``cache="name"``), read and written in its format.

The file is one JSON object: ``device_name``, ``kernel_name``, ``problem_size``, ``tune_params_keys``,
``tune_params``, ``objective`` and ``cache``, which maps ``"v1,v2,..."`` (the parameter values in
``tune_params`` order, joined by commas) to the result dict of that config. Failed configs hold the
strings ``"InvalidConfig"``, ``"CompilationFailedConfig"`` or ``"RuntimeFailedConfig"`` as their time.
Kernel Tuner appends one entry per line while tuning and leaves the file open (no closing
brackets) until the end; both forms are read. ``.json`` is appended to a name without it, as Kernel
Tuner does. A file that belongs to another device, kernel or parameter list raises
:class:`~tracea.errors.InvalidArgumentError` naming ``cache`` (Kernel Tuner raises ValueError).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

from ..errors import InvalidArgumentError

ERROR_STRINGS = ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", "ErrorConfig")


def key_of(params: Mapping[str, Any], names: Sequence[str]) -> str:
    return ",".join(str(params[n]) for n in names)


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def _read(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    if text and text[-3:] not in ("}\n}", "}}}"):
        text = text.rstrip(",") + "}\n}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError("cache", path, f"a Kernel Tuner cache file (not valid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cache"), dict):
        raise InvalidArgumentError("cache", path, "a Kernel Tuner cache file (an object with a 'cache' object)")
    return data


class KTCache:
    """An open Kernel Tuner cache file: :meth:`get` earlier results, :meth:`put` new ones, :meth:`close`."""

    def __init__(self, filename: Any, *, device_name: str, kernel_name: str, problem_size: Any,
                 tune_params: Mapping[str, Sequence[Any]], objective: str) -> None:
        path = os.fspath(filename)
        if not isinstance(path, str) or not path:
            raise InvalidArgumentError("cache", filename, "a file name")
        if not path.endswith(".json"):
            path += ".json"
        self.path = os.path.abspath(path)
        self.names = list(tune_params)
        self.entries: dict[str, dict[str, Any]] = {}
        if os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
            data = _read(self.path)
            if data.get("device_name") != device_name:
                raise InvalidArgumentError("cache", self.path, f"results for this device ({device_name}); "
                                                               f"it holds {data.get('device_name')!r}")
            if data.get("kernel_name") != kernel_name:
                raise InvalidArgumentError("cache", self.path, f"results for kernel {kernel_name!r}; "
                                                               f"it holds {data.get('kernel_name')!r}")
            if list(data.get("tune_params_keys", [])) != self.names:
                raise InvalidArgumentError("cache", self.path, f"tunable parameters {self.names}; it holds "
                                                               f"{data.get('tune_params_keys')}")
            ps = data.get("problem_size")
            if ps not in (None, "callable") and not callable(problem_size) and \
                    list(_as_list(ps)) != list(_as_list(problem_size)):
                raise InvalidArgumentError("cache", self.path, f"problem size {problem_size}; it holds {ps}")
            self.entries = {str(k): v for k, v in data["cache"].items() if isinstance(v, dict)}
            self._rewrite_open(data)
        else:
            header = {"device_name": device_name, "kernel_name": kernel_name,
                      "problem_size": "callable" if callable(problem_size) else _as_list(problem_size),
                      "tune_params_keys": self.names, "tune_params": {k: list(v) for k, v in tune_params.items()},
                      "objective": objective, "cache": {}}
            self._write_text(json.dumps(header, default=_default, indent="")[:-3])

    def _rewrite_open(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, default=_default, indent="")
        self._write_text(text[:-3] + ("," if self.entries else ""))

    def _write_text(self, text: str) -> None:
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, self.path)

    def get(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored result of ``params`` (None when absent)."""
        return self.entries.get(key_of(params, self.names))

    def put(self, params: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        key = key_of(params, self.names)
        if key in self.entries:
            return
        out = {k: _jsonable(v) for k, v in result.items()}
        self.entries[key] = out
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n" + json.dumps({key: out}, default=_default)[1:-1] + ",")

    def close(self) -> None:
        """Close the JSON object so ordinary parsers read the file (Kernel Tuner re-opens it on load)."""
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        if text.endswith(","):
            self._write_text(text[:-1] + "}\n}")
        elif not text.rstrip().endswith("}\n}") and text.rstrip().endswith("{"):
            self._write_text(text + "}\n}")


def _as_list(ps: Any) -> list[Any]:
    if isinstance(ps, (list, tuple)):
        return [int(x) if hasattr(x, "item") else x for x in ps]
    return [int(ps) if hasattr(ps, "item") else ps]


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item") and not hasattr(v, "__len__"):
        return v.item()
    return v
