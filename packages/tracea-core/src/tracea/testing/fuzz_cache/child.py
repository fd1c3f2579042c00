"""The cache fuzzer's child process: ``python -m tracea.testing.fuzz_cache.child RECIPES.json WORKDIR``.

For each recipe (see :mod:`.cases`) it builds the cache path in its own directory, makes it the
process cache, then dispatches ``matmul``, ``conv2d`` and ``attention`` on small NumPy arrays
(checked against float64 NumPy), runs ``tracea cache ls / ls --json / show`` (and sometimes export,
import, clear) through the CLI entry point, ``put`` s a new entry, and checks what is left on disk
against :mod:`.oracle`. Protocol lines on stdout start with :data:`MARK`: ``{"start": id}`` before a
case and ``{"end": id, ...}`` after, so the parent can tell which case crashed or hung.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import io
import json
import os
import shutil
import socket
import stat
import sys
import warnings
from typing import Any, Callable

import numpy as np

from . import oracle
from .report import MARK


class Env:
    """What every case shares: the Doctor, the host profile, the dispatched ops and their inputs."""

    def __init__(self) -> None:
        import tracea
        from tracea.doctor.doctor import Doctor, get_doctor
        from tracea.errors import TraceaError

        self.tracea_error = TraceaError
        self.doctor = get_doctor()
        self.profile = self.doctor.profile_for("cpu")
        rng = np.random.default_rng(0)
        f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # type: ignore[attr-defined]  # noqa: E731
        a, b, a2, b2 = f32(24, 16), f32(16, 20), f32(32, 16), f32(16, 24)
        x, w, x2, w2 = f32(1, 8, 10, 10), f32(16, 8, 3, 3), f32(1, 4, 8, 8), f32(8, 4, 3, 3)
        q, q2 = f32(1, 2, 8, 16), f32(1, 1, 16, 8)
        ops = tracea.ops
        self.caches: list[Any] = []  # kept alive: the Doctor memoises decisions by id(cache)
        self.calls: dict[str, tuple[Callable[[], Any], np.ndarray]] = {
            "gemm": (lambda: ops.matmul(a, b), oracle.gemm_ref(a, b)),
            "conv": (lambda: ops.conv2d(x, w, padding=1), oracle.conv2d_ref(x, w, 1)),
            "attention": (lambda: ops.attention(q, q * 0.5, q + 1), oracle.attention_ref(q, q * 0.5, q + 1)),
            "gemm_g": (lambda: ops.matmul(a2, b2), oracle.gemm_ref(a2, b2)),
            "conv_g": (lambda: ops.conv2d(x2, w2, padding=1), oracle.conv2d_ref(x2, w2, 1)),
            "attention_g": (lambda: ops.attention(q2, q2, q2), oracle.attention_ref(q2, q2, q2)),
        }
        # The ops exactly as dispatch builds them: recorded from Doctor.decide during a warm-up run
        # (which also compiles the kernels).
        seen: list[Any] = []
        real = Doctor.decide

        def record(doc: Any, op: Any, *a: Any, **kw: Any) -> Any:
            seen.append(op)
            return real(doc, op, *a, **kw)

        Doctor.decide = record  # type: ignore[assignment,method-assign]
        self.ops: dict[str, Any] = {}
        try:
            from tracea.tuning.cache import set_cache

            set_cache(os.devnull + ".none")  # no cache during the warm-up
            for name, (call, _) in self.calls.items():
                seen.clear()
                call()
                self.ops[name] = seen[0]
        finally:
            Doctor.decide = real  # type: ignore[method-assign]
        from tracea.ir.ops import GemmOp

        self.new_op = GemmOp(40, 40, 40)

    def candidates(self, op: Any) -> list[Any]:
        return self.doctor.decide(op, "cpu", use_cache=False).candidates

    def good_entries(self, cache: Any) -> dict[str, dict[str, Any]]:
        """One current entry per good op (its chosen variant and config) and one stale one."""
        out = {}
        for name in ("gemm_g", "conv_g", "attention_g"):
            c = self.candidates(self.ops[name])[0]
            e = cache.make_entry(self.ops[name], c.variant, self.profile, c.config, {"median_s": 1e-3}, trials=1)
            out[e.key] = dict(e.to_json(), tuned_at=1.7e9)
        stale = copy.deepcopy(next(iter(out.values())))
        stale["fingerprint"] = "0" * 16
        out[_key(stale)] = stale
        return out

    def hostile_entries(self, cache: Any, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Entries matching this machine's fingerprint for every candidate variant of the op, edited."""
        out = {}
        op = self.ops[spec["op"]]
        for c in self.candidates(op):
            e = cache.make_entry(op, c.variant, self.profile, c.config, {"median_s": 1e-9}, trials=1)
            d = dict(e.to_json(), tuned_at=1.7e9)
            for edit in spec.get("config", []):
                _edit(d.setdefault("config", {}), edit)
            for edit in spec.get("entry", []):
                _edit(d, edit)
            out[e.key] = d
        return out


def _key(d: dict[str, Any]) -> str:
    return f"{d['op_key']}|{d['variant']}|{d['fingerprint']}|{d['goal']}"


class _Raw:
    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def value(self, v: Any) -> Any:
        if isinstance(v, dict) and "$raw" in v:
            token = f"@@RAW{len(self.items)}@@"
            self.items[token] = v["$raw"]
            return token
        if isinstance(v, dict) and "$long" in v:
            return "x" * int(v["$long"])
        return v

    def render(self, text: str) -> str:
        for token, raw in self.items.items():
            text = text.replace(json.dumps(token), raw)
        return text


_RAW = _Raw()


def _edit(target: Any, edit: dict[str, Any], symbols: dict[str, str] | None = None) -> None:
    path = [symbols.get(p, p) if symbols else p for p in edit["path"]]
    for p in path[:-1]:
        nxt = target.get(p) if isinstance(target, dict) else None
        if not isinstance(nxt, dict):
            nxt = {}
            target[p] = nxt
        target = nxt
    if edit.get("delete"):
        target.pop(path[-1], None)
    else:
        target[path[-1]] = _RAW.value(edit["value"])


def build_bytes(env: Env, cache: Any, recipe: dict[str, Any]) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """The cache file's bytes for ``recipe``, and the good entries (key -> JSON) it was built with."""
    _RAW.items.clear()
    good = env.good_entries(cache)
    hostile: dict[str, dict[str, Any]] = {}
    keys_h: list[str] = []
    for spec in recipe.get("hostile", []):
        made = env.hostile_entries(cache, spec)
        keys_h.append(next(iter(made)))
        hostile.update(made)
    symbols = {f"$G{i}": k for i, k in enumerate(good)}
    symbols.update({f"$H{i}": k for i, k in enumerate(keys_h)})
    doc: dict[str, Any] = {"format": oracle.FORMAT, "version": 1,
                           "entries": copy.deepcopy({**good, **hostile})}  # edits must not touch ``good``
    for edit in recipe.get("doc", []):
        if "rekey" in edit:
            entries = doc["entries"]
            entries[symbols.get(edit["to"], edit["to"])] = entries.pop(symbols[edit["rekey"]])
        else:
            _edit(doc, edit, symbols)
    dup = recipe.get("duplicate")
    if dup == "entry":
        g1 = symbols["$G1"]
        doc["entries"]["@@DUP@@"] = dict(copy.deepcopy(doc["entries"][g1]), median_s=2e-3)
    elif dup == "entries":
        doc["@@DUP@@"] = {}
    elif dup == "field":
        doc["entries"][keys_h[0]]["@@DUP@@"] = "x"
    elif dup == "format":
        doc["@@DUP@@"] = "other"
    text = _RAW.render(json.dumps(doc, indent=1))
    if dup:
        name = {"entry": json.dumps(symbols.get("$G1", "")), "entries": '"entries"', "field": '"variant"',
                "format": '"format"'}[dup]
        text = text.replace('"@@DUP@@"', name)
    data = text.encode("utf-8", "surrogatepass")
    for edit in recipe.get("text", []):
        data = _text_edit(data, edit)
    return data, good


def _text_edit(data: bytes, edit: dict[str, Any]) -> bytes:
    op, n = edit["op"], len(data)
    if op == "replace":
        return bytes.fromhex(edit["data"])
    if op == "truncate":
        return data[: int(edit["at"] * n)]
    if op == "flip":
        buf = bytearray(data)
        for at, value in zip(edit["at"], edit["bytes"]):
            if buf:
                buf[min(n - 1, int(at * n))] = value
        return bytes(buf)
    at = int(edit["at"] * n)
    if op == "insert":
        return data[:at] + edit["data"].encode("latin-1") + data[at:]
    return data[:at] + data[at + int(edit["len"]):]  # delete


def make_path(kind: str, case_dir: str, data: bytes) -> tuple[str, str | None, bytes | None]:
    """Create what sits at the cache path; returns (cache path, the regular file holding ``data`` or
    None, the bytes written there)."""
    path = os.path.join(case_dir, "tuning_cache.json")
    if kind in ("regular", "perm", "huge"):
        if kind == "huge":
            data = data + b" " * (oracle.MAX_BYTES + 1 - len(data))
        with open(path, "wb") as f:
            f.write(data)
        if kind == "perm":
            os.chmod(path, 0)
        return path, path, data
    if kind == "parent-file":
        blocker = os.path.join(case_dir, "blocker")
        with open(blocker, "w") as f:
            f.write("a file where the cache directory should be\n")
        return os.path.join(blocker, "tuning_cache.json"), None, None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.makedirs(path)
        with open(os.path.join(path, "user.txt"), "w") as f:
            f.write("user data")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif kind == "symlink-loop":
        os.symlink(path + ".b", path)
        os.symlink(path, path + ".b")
    elif kind == "symlink-self":
        os.symlink(path, path)
    elif kind == "symlink-good":
        with open(path + ".target", "wb") as f:
            f.write(data)
        os.symlink(path + ".target", path)
        return path, path + ".target", data
    elif kind == "symlink-dangling":
        os.symlink(path + ".nothere", path)
    elif kind == "symlink-fifo":
        os.mkfifo(path + ".fifo")
        os.symlink(path + ".fifo", path)
    elif kind == "symlink-devnull":
        os.symlink(os.devnull, path)
    else:
        raise ValueError(f"unknown path kind {kind}")
    return path, None, None


def _path_type(path: str) -> str:
    try:
        return stat.filemode(os.lstat(path).st_mode)[0]
    except OSError:
        return "missing"


def run_case(env: Env, recipe: dict[str, Any], workdir: str) -> dict[str, Any]:
    """Run one recipe; returns its findings (types: :data:`.report.ROWS`) and what was observed."""
    from tracea.tuning.cache import TuningCache, set_cache

    if recipe.get("selftest") == "crash":  # the harness's own tests: a crash and a hang must be attributed
        os.abort()
    if recipe.get("selftest") == "hang":
        import time

        time.sleep(3600)
    case_dir = os.path.join(workdir, f"c{recipe['id']}")
    os.makedirs(case_dir)
    findings: list[dict[str, str]] = []
    add = lambda kind, detail: findings.append({"type": kind, "detail": str(detail)[:500]})  # noqa: E731
    kind = recipe.get("path", "regular")
    try:
        data, good = build_bytes(env, TuningCache(os.path.join(case_dir, "unused.json")), recipe)
        path, regular, original = make_path(kind, case_dir, data)
    except Exception as exc:  # noqa: BLE001 - the fuzzer's own failure, reported apart
        shutil.rmtree(case_dir, ignore_errors=True)
        return {"findings": [], "harness_error": f"{type(exc).__name__}: {exc}", "verdict": "", "put": False}
    before_type = _path_type(path)
    cache = TuningCache(path)
    env.caches.append(cache)
    env.doctor.invalidate()
    set_cache(cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, (call, ref) in env.calls.items():
            try:
                err = oracle.rel_err(call(), ref)
                if not err < 1e-4:
                    add("wrong_result", f"{name}: relative error {err:.3g}")
            except env.tracea_error as exc:
                add("blocked_dispatch", f"{name}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001
                add("non_tracea_exception", f"{name}: {type(exc).__name__}: {exc}")
        _cli(path, recipe, case_dir, add)
        put_ok = _put(env, cache, path, kind, add)
    verdict, entries = oracle.classify(original)
    _check_files(path, regular, kind, original, verdict, entries, good, before_type, put_ok, add)
    if verdict == oracle.ENTRIES and regular:
        _check_good_used(env, path, entries, good, add)
    set_cache(None)
    if kind == "perm" and os.path.exists(path):
        os.chmod(path, 0o644)
    shutil.rmtree(case_dir, ignore_errors=True)
    return {"findings": findings, "warnings": len(caught), "verdict": verdict, "put": put_ok}


def _cli(path: str, recipe: dict[str, Any], case_dir: str, add: Callable[[str, str], None]) -> None:
    from tracea.cli.main import main

    export = os.path.join(case_dir, "export.json")
    commands = [(["ls"], (0,)), (["ls", "--json"], (0,)), (["show", "0"], (0, 1)), (["show", "gemm"], (0, 1)),
                (["show", "--json", "0"], (0, 1))]
    # export the hostile cache, import it back (existing entries win), clear the export's stale entries
    extra = {"export": (["export", export], (0, 2)), "import": (["import", export], (0, 2)),
             "clear-stale": (["clear", "--stale", "--yes"], (0,))}
    commands += [extra[c] for c in recipe.get("cli", []) if c in extra]
    for argv, allowed in commands:
        out, err = io.StringIO(), io.StringIO()
        base = ["cache", "--cache", export if argv[0] == "clear" else path]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(base + argv)
            if rc not in allowed:
                add("cli_error", f"tracea cache {' '.join(argv)}: exit {rc}: {err.getvalue()[-300:]}")
            elif argv == ["ls", "--json"]:
                json.loads(out.getvalue())
        except SystemExit as exc:
            add("cli_error", f"tracea cache {' '.join(argv)}: SystemExit {exc.code}")
        except Exception as exc:  # noqa: BLE001
            add("non_tracea_exception", f"tracea cache {' '.join(argv)}: {type(exc).__name__}: {exc}")


def _put(env: Env, cache: Any, path: str, kind: str, add: Callable[[str, str], None]) -> bool:
    from tracea.tuning.cache import TuningCache

    try:
        c = env.candidates(env.new_op)[0]
        ok = cache.put(cache.make_entry(env.new_op, c.variant, env.profile, c.config, {"median_s": 1e-3}))
    except Exception as exc:  # noqa: BLE001
        add("non_tracea_exception", f"put: {type(exc).__name__}: {exc}")
        return False
    writable = kind in ("regular", "perm", "huge", "symlink-good", "symlink-dangling")
    if writable and not ok:
        add("put_failed", f"put returned False on a writable {kind} path")
    if ok and TuningCache(path).lookup(env.new_op, c.variant, env.profile) is None:
        add("put_failed", "the entry put is not in the file")
    return ok


def _read_json_entries(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        return doc["entries"] if isinstance(doc, dict) and isinstance(doc.get("entries"), dict) else None
    except Exception:  # noqa: BLE001
        return None


def _check_files(path: str, regular: str | None, kind: str, original: bytes | None, verdict: str,
                 entries: dict[str, Any], good: dict[str, Any], before_type: str, put_ok: bool,
                 add: Callable[[str, str], None]) -> None:
    if regular is None:  # not a regular file: it must still be there, untouched
        if _path_type(path) != before_type and not (kind == "symlink-dangling" and put_ok):
            add("not_kept_aside", f"{kind} at the cache path became {_path_type(path)}")
        if kind == "dir" and not os.path.isfile(os.path.join(path, "user.txt")):
            add("not_kept_aside", "a file in the directory at the cache path disappeared")
        return
    asides = glob.glob(glob.escape(path) + ".corrupt-*") + glob.glob(glob.escape(regular) + ".corrupt-*")
    preserved = False
    for p in set(asides):
        with open(p, "rb") as f:
            preserved = preserved or f.read() == original
    final = _read_json_entries(regular)
    if os.path.exists(regular) and final is None and put_ok:
        add("put_failed", "the cache file is not valid JSON after a successful put")
    final = final or {}
    if verdict in (oracle.FILE, oracle.DUPLICATES) and not preserved:
        if not (kind == "perm" and _unchanged(regular, original)):
            add("not_kept_aside", f"{verdict}-level damage but no byte-identical copy aside (asides: {len(asides)})")
    if verdict == oracle.ENTRIES:
        dropped = [k for k in entries if k not in final]
        if dropped and not preserved:
            add("not_kept_aside", f"{len(dropped)} entries dropped without a copy aside: {dropped[0][:80]}")
        for k, d in good.items():
            if oracle.same(entries.get(k), d) and k not in final:
                add("lost_good", f"good entry dropped: {k[:100]}")


def _unchanged(path: str, original: bytes | None) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == original
    except OSError:
        return False


def _check_good_used(env: Env, path: str, entries: dict[str, Any], good: dict[str, Any],
                     add: Callable[[str, str], None]) -> None:
    """Undamaged current good entries must still be what dispatch uses."""
    from tracea.tuning.cache import TuningCache, set_cache

    set_cache(TuningCache(path))
    for name in ("gemm_g", "conv_g", "attention_g"):
        op = env.ops[name]
        mine = [k for k, d in good.items() if d["op_key"] == op.key and d["fingerprint"] != "0" * 16]
        if not all(oracle.same(entries.get(k), good[k]) for k in mine):
            continue
        try:
            chosen = env.doctor.decide(op, "cpu").chosen
        except Exception as exc:  # noqa: BLE001
            add("blocked_dispatch", f"{name}: decide: {type(exc).__name__}: {exc}")
            continue
        if chosen.source != "cache":
            add("good_ignored", f"{name}: dispatch took a {chosen.source} config, not the good cache entry "
                                f"({chosen.note or 'no note'})")


def main(argv: list[str]) -> int:
    recipes_path, workdir = argv[0], argv[1]
    with open(recipes_path) as f:
        recipes = json.load(f)
    warnings.simplefilter("ignore")
    env = Env()
    for recipe in recipes:
        print(MARK + json.dumps({"start": recipe["id"]}), flush=True)
        result = run_case(env, recipe, workdir)
        print(MARK + json.dumps({"end": recipe["id"], **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
