"""The seeded stream of cache-fuzzing cases: JSON recipes a child process turns into a cache file.

A recipe is a dict:

- ``id``, ``kind`` (``family/detail``, for the report);
- ``path``: what sits at the cache path -- ``regular`` (a file built from the recipe), ``fifo``,
  ``dir``, ``socket``, ``symlink-loop``, ``symlink-self``, ``symlink-good`` (a link to the file),
  ``symlink-dangling``, ``symlink-fifo``, ``symlink-devnull``, ``perm`` (mode 000), ``parent-file``
  (the cache's directory is a file), ``huge`` (more than 64 MiB);
- ``hostile``: fingerprint-matching entries the child makes with ``TuningCache.make_entry`` for the
  ops it dispatches (every candidate variant, its default config), each then edited by ``config``
  (edits of the config) and ``entry`` (edits of the entry's other fields);
- ``doc``: edits of the whole document (``version``, ``format``, ``entries``, an entry by symbolic
  key ``$H<i>`` / ``$G<i>``), applied before serialising;
- ``text``: edits of the serialised bytes (truncate, flip bytes, insert, delete, replace, pad);
- ``cli``: extra CLI commands to run (export / import / clear).

An edit is ``{"path": [...], "value": V}`` or ``{"path": [...], "delete": true}``; ``V`` is JSON, or
``{"$raw": "text"}`` for literal JSON text (``NaN``, ``1e400``, 5000-digit integers, deep
nesting), or ``{"$long": n}`` for a string of ``n`` characters. The good entries every regular case
also holds are made by the child; every edit that touches one names it (``$G<i>``).
"""

from __future__ import annotations

import random
from typing import Any, Iterator

DEEP = [{"$raw": "[" * n + "]" * n} for n in (65, 200, 1000, 5000)] + [{"$raw": '{"a":' * 300 + "1" + "}" * 300}]
INTS = [0, -1, 1, 2, 3, 7, 17, 64, 1000, 10**6, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 + 1,
        -(2**63), 10**30, {"$raw": "9" * 41}, {"$raw": "9" * 5000}, {"$raw": "-" + "9" * 5000}]
FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, -1.5, 1e-300, 1e308, {"$raw": "1e400"}, {"$raw": "-1e400"},
          {"$raw": "NaN"}, {"$raw": "Infinity"}, {"$raw": "-Infinity"}, {"$raw": "1E+2"}]
STRINGS = ["", "x", "1", "-1", "0x10", "none", "NaN", "\u0000", "\ud800", "\u202e", "a|b|c|d", "../../etc/passwd",
           {"$long": 5000}, {"$long": 1 << 20}]
OTHER = [None, True, False, [], [1], [[1, [2]]], {}, {"a": 1}, {"tile_m": 1}, {"$raw": '{"a": 1, "a": 2}'}]
VALUES = INTS + FLOATS + STRINGS + OTHER + DEEP

FILE_FIELDS = ["version", "format", "entries"]
ENTRY_FIELDS = ["op_key", "variant", "fingerprint", "goal", "config", "median_s", "p90_s", "cv", "score_s", "trials",
                "backend", "device", "device_name", "device_fp", "op", "env", "tuned_at", "tracea_version"]
CONFIG_FIELDS = ["tile_m", "tile_n", "tile_k", "stages", "warps", "swizzle", "barrier", "params"]
PARAMS = ["mr", "nr", "mc", "nc", "kc", "threads", "indirect", "bq", "bk", "unknown", "sleep_s"]
PATH_KINDS = ["fifo", "dir", "socket", "symlink-loop", "symlink-self", "symlink-good", "symlink-dangling",
              "symlink-fifo", "symlink-devnull", "perm", "parent-file"]
HOSTILE_OPS = ["gemm", "conv", "attention"]


def cases(seed: int) -> Iterator[dict[str, Any]]:
    """The endless, deterministic stream of recipes for ``seed``: every family in turn, each drawing
    its values from ``random.Random(seed)``, so case ``i`` is the same in every run with that seed."""
    rng = random.Random(seed)
    families = [_file_field, _entry_field, _config_field, _param, _text, _text, _replace, _nesting, _duplicates,
                _rekey, _path_kind, _clean]
    i = 0
    while True:
        for family in families:
            recipe = family(rng)
            recipe.setdefault("path", "regular")
            recipe["id"] = i
            if i % 7 == 3:
                recipe.setdefault("cli", ["export", "import", "clear-stale"])
            yield recipe
            i += 1
        if i % (len(families) * 40) == 0:
            yield {"id": i, "kind": "path/huge", "path": "huge"}
            i += 1


def _v(rng: random.Random, pool: list[Any] = VALUES) -> Any:
    return rng.choice(pool)


def _file_field(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(FILE_FIELDS)
    if rng.random() < 0.1:
        return {"kind": f"file/{name}=<deleted>", "doc": [{"path": [name], "delete": True}]}
    value = _v(rng)
    return {"kind": f"file/{name}", "doc": [{"path": [name], "value": value}], "value": _label(value)}


def _entry_field(rng: random.Random) -> dict[str, Any]:
    name, op = rng.choice(ENTRY_FIELDS), rng.choice(HOSTILE_OPS)
    edit: dict[str, Any] = {"path": [name], "delete": True} if rng.random() < 0.1 else {"path": [name], "value": _v(rng)}
    target = "good" if rng.random() < 0.25 else "hostile"
    kind = f"entry/{target}/{name}"
    if target == "good":  # damage one good entry: the others must survive
        return {"kind": kind, "doc": [dict(edit, path=["entries", "$G0"] + edit["path"])], "value": _label(edit.get("value"))}
    return {"kind": kind, "hostile": [{"op": op, "entry": [edit]}], "value": _label(edit.get("value"))}


def _config_field(rng: random.Random) -> dict[str, Any]:
    name, op = rng.choice(CONFIG_FIELDS), rng.choice(HOSTILE_OPS)
    value = _v(rng, INTS + FLOATS + STRINGS[:10] + OTHER) if name != "params" else _v(rng, OTHER + STRINGS[:4] + INTS[:3])
    return {"kind": f"config/{name}", "hostile": [{"op": op, "config": [{"path": [name], "value": value}]}],
            "value": _label(value)}


def _param(rng: random.Random) -> dict[str, Any]:
    name, op = rng.choice(PARAMS), rng.choice(HOSTILE_OPS)
    value = _v(rng, INTS + INTS + FLOATS + STRINGS[:10] + OTHER[:3])
    edits = [{"path": ["params", name], "value": value}]
    if rng.random() < 0.3:  # two hostile params at once
        edits.append({"path": ["params", rng.choice(PARAMS)], "value": _v(rng, INTS)})
    return {"kind": f"param/{name}", "hostile": [{"op": op, "config": edits}], "value": _label(value)}


def _text(rng: random.Random) -> dict[str, Any]:
    op = rng.choice(["truncate", "flip", "insert", "delete"])
    if op == "truncate":
        edit: dict[str, Any] = {"op": op, "at": rng.random()}
    elif op == "flip":
        edit = {"op": op, "at": [rng.random() for _ in range(rng.randint(1, 8))],
                "bytes": [rng.randrange(256) for _ in range(8)]}
    elif op == "insert":
        edit = {"op": op, "at": rng.random(), "data": rng.choice(['"', "{", "}", "[", "]", ",", ":", "\\", "\x00",
                                                                    "\xff", '"a": 1,', "null", "/*", "\n" * 3])}
    else:
        edit = {"op": op, "at": rng.random(), "len": rng.randint(1, 64)}
    return {"kind": f"text/{op}", "hostile": [{"op": rng.choice(HOSTILE_OPS)}], "text": [edit]}


def _replace(rng: random.Random) -> dict[str, Any]:
    data = rng.choice([b"", b"   \n", b"null", b"[]", b"{}", b"0", b'"tracea-tuning-cache"', b"\xff\xfe\x00{",
                       b"\xef\xbb\xbf{}", b'{"format": "tracea-tuning-cache", "entries": {}}\x00garbage',
                       bytes(rng.randrange(256) for _ in range(rng.randint(1, 512))),
                       '{"format": "tracea-tuning-cache", "entries": {"\u00e9": 1}}'.encode("utf-16"),
                       b'{"format": "tracea-tuning-cache", "version": 1, "entries": {"k": ' + b"[" * 100000 + b"}}"])
    return {"kind": "text/replace", "text": [{"op": "replace", "data": data.hex()}]}


def _nesting(rng: random.Random) -> dict[str, Any]:
    where = rng.choice([["entries"], ["entries", "$H0", "env"], ["entries", "$H0", "config", "params", "x"],
                        ["entries", "$G0", "op"], ["format"], ["entries", "$H0", "config"]])
    return {"kind": f"nesting/{'.'.join(w.strip('$') for w in where)}", "hostile": [{"op": "gemm"}],
            "doc": [{"path": where, "value": rng.choice(DEEP)}]}


def _duplicates(rng: random.Random) -> dict[str, Any]:
    what = rng.choice(["entry", "entries", "field", "format"])
    return {"kind": f"duplicate/{what}", "hostile": [{"op": "gemm"}], "duplicate": what}


def _rekey(rng: random.Random) -> dict[str, Any]:
    return {"kind": "entry/key-mismatch", "hostile": [{"op": "gemm"}, {"op": "conv"}],
            "doc": [{"rekey": "$H0", "to": rng.choice(["$H1", "x|y|z|max_tflops", ""])}]}


def _path_kind(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(PATH_KINDS)
    return {"kind": f"path/{kind}", "path": kind, "hostile": [{"op": rng.choice(HOSTILE_OPS)}]}


def _clean(rng: random.Random) -> dict[str, Any]:
    """A hostile-free file, or one whose edits keep every value valid: nothing may be lost or ignored."""
    benign = rng.choice([[], [{"path": ["params", "threads"], "value": 1}], [{"path": ["params", "threads"], "value": 0}]])
    return {"kind": "clean", "hostile": [{"op": rng.choice(HOSTILE_OPS), "config": benign}]}


def _label(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
