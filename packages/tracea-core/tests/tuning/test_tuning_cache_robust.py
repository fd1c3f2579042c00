"""Regression tests for the tuning-cache fuzzing report: hostile files and entries never stop
dispatch, never reach a kernel, never lose good entries and are always kept aside (docs/tuning.md,
"Cache robustness")."""

import glob
import json
import os
import threading
import time
import warnings

import numpy as np
import pytest

import tracea
from tracea.ir import GemmOp
from tracea.semantic.config import PipelineConfig
from tracea.tuning import cache_file, cache_schema
from tracea.tuning.cache import TuningCache, TuningCacheWarning, set_cache

STATS = {"median_s": 1e-4, "p90_s": 1.2e-4, "cv": 0.05}
GOOD = PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1)
V = "testnp.gemm.blocked"


def _variant(doctor):
    return next(v for v in doctor.variants() if v.name == V)


def _entry(cache, doctor, op, config=GOOD, **stats):
    return cache.make_entry(op, _variant(doctor), doctor.profile_for("cpu"), config, dict(STATS, **stats))


def _good_file(cache, doctor, n=2):
    """A cache file with ``n`` good entries; returns their keys."""
    entries = [_entry(cache, doctor, GemmOp(16 + i, 16, 16)) for i in range(n)]
    assert cache.put(*entries)
    return [e.key for e in entries]


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())


def _aside(cache):
    return sorted(glob.glob(cache.path + ".corrupt-*"))


@pytest.fixture
def dispatch(doctor, cache):
    """tracea.ops.matmul through the test Doctor, with a fresh instance of ``cache``'s file as the
    process cache (so it reads the file as a new process would); checks the result."""
    rng = np.random.default_rng(0)

    def run(m=24, n=20, k=16):
        set_cache(TuningCache(cache.path))
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = tracea.ops.matmul(a, b)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
        return out

    yield run
    set_cache(None)


# -- 1. a non-integer version is a corrupt file --------------------------------------------------
@pytest.mark.parametrize("version", ['"abc"', "[1]", "1e400", "NaN", "true", "1.5", "-Infinity", "null"])
def test_non_integer_version_is_moved_aside_and_dispatch_goes_on(doctor, cache, dispatch, version):
    text = '{"format": "tracea-tuning-cache", "version": %s, "entries": {}}' % version
    _write(cache.path, text)
    with pytest.warns(TuningCacheWarning, match="moved it to"):
        dispatch()
    assert [open(p).read() for p in _aside(cache)] == [text]
    assert not os.path.exists(cache.path)
    assert cache.put(_entry(cache, doctor, GemmOp(8, 8, 8)))


@pytest.mark.parametrize("version", ["7", "9" * 41, "9" * 5000])
def test_newer_integer_version_is_read_with_a_warning(doctor, cache, version):
    _good_file(cache, doctor)
    data = json.load(open(cache.path))
    data["version"] = "@V@"
    _write(cache.path, json.dumps(data).replace('"@V@"', version))
    with pytest.warns(TuningCacheWarning, match="newer Tracea"):
        assert len(TuningCache(cache.path)) == 2
    assert not _aside(cache)


# -- 2. deep nesting ------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["entries", "entry", "config", "top"])
def test_deep_nesting_is_corrupt_not_a_recursion_error(doctor, cache, dispatch, where):
    deep = "[" * 1000 + "]" * 1000
    if where == "entries":
        text = '{"format": "tracea-tuning-cache", "version": 1, "entries": %s}' % deep
    elif where == "top":
        text = deep
    else:
        _good_file(cache, doctor, 1)
        data = json.load(open(cache.path))
        key, e = next(iter(data["entries"].items()))
        if where == "entry":
            e["extra"] = "@DEEP@"
        else:
            e["config"]["params"]["x"] = "@DEEP@"
        text = json.dumps(data).replace('"@DEEP@"', deep)
    _write(cache.path, text)
    with pytest.warns(TuningCacheWarning, match="moved it to"):
        dispatch()
    assert [open(p).read() for p in _aside(cache)] == [text]


def test_moderate_nesting_inside_an_entry_drops_only_that_entry(doctor, cache):
    keys = _good_file(cache, doctor, 2)
    data = json.load(open(cache.path))
    data["entries"][keys[0]]["env"]["x"] = json.loads("[" * 10 + "]" * 10)
    _write(cache.path, json.dumps(data))
    with pytest.warns(TuningCacheWarning, match="copied it to"):
        assert [e.key for e in TuningCache(cache.path).entries()] == [keys[1]]
    assert len(_aside(cache)) == 1 and keys[0] in open(_aside(cache)[0]).read()
    assert list(json.load(open(cache.path))["entries"]) == [keys[1]]  # rewritten clean, copied once
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningCacheWarning)
        assert len(TuningCache(cache.path)) == 1


def test_nesting_scan_ignores_brackets_inside_strings():
    assert not cache_schema.nesting_exceeds(json.dumps({"a": "[" * 500, "b": ["{" * 300]}).encode(), 8)
    assert cache_schema.nesting_exceeds(b'{"a": "\\"", "b": ' + b"[" * 9 + b"]" * 9 + b"}", 8)
    assert not cache_schema.nesting_exceeds(b'"unterminated \\" [[[[[[[[[[[[', 8)


# -- 3. cached configs are checked before they run ----------------------------------------------
@pytest.mark.parametrize("config", [
    PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1, params=(("sleep_s", 30.0),)),  # extra param
    PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=2),        # core field outside the space
    PipelineConfig(tile_m=48, tile_n=32, tile_k=32, warps=1),        # value not a candidate
    PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1, params=(("threads", "x"),)),
], ids=["extra-param", "warps", "tile", "threads-str"])
def test_config_outside_space_and_heroes_is_ignored_and_reported(doctor, cache, dispatch, config, capsys):
    import tracea_tuning_testplugin as plugin

    op = GemmOp(24, 20, 16)
    assert cache.put(_entry(cache, doctor, op, config, median_s=1e-9))
    start = time.monotonic()
    with pytest.warns(TuningCacheWarning, match="neither a hero config nor a point"):
        dispatch(24, 20, 16)
    assert time.monotonic() - start < 10 and config.key not in plugin.RUNS
    cand = next(c for c in doctor.decide(op, "cpu").candidates if c.variant.name == V)
    assert cand.source == "hero" and "tuning-cache entry ignored" in cand.note
    assert "note: tuning-cache entry ignored" in doctor.explain(op)
    from tracea.cli.main import main

    assert main(["cache", "--cache", cache.path, "ls"]) == 0
    assert "invalid" in capsys.readouterr().out
    assert main(["cache", "--cache", cache.path, "show", "0"]) == 0
    assert "neither a hero config" in capsys.readouterr().out


def test_config_in_the_space_is_used_from_the_cache(doctor, cache, dispatch):
    op = GemmOp(24, 20, 16)
    cfg = PipelineConfig(tile_m=16, tile_n=64, tile_k=16, warps=1)
    assert cache.put(_entry(cache, doctor, op, cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningCacheWarning)
        dispatch(24, 20, 16)
    assert doctor.decide(op, "cpu").chosen.source == "cache"


@pytest.mark.parametrize("median", [float("nan"), float("inf"), -1.0])
def test_bad_measured_times_are_never_stored_nor_used(doctor, cache, dispatch, median):
    op = GemmOp(24, 20, 16)
    with pytest.warns(TuningCacheWarning, match="not recording"):
        assert not cache.put(_entry(cache, doctor, op, median_s=median))
    good = _entry(cache, doctor, op)
    data = {"format": "tracea-tuning-cache", "version": 1, "entries": {good.key: dict(good.to_json(), median_s=median)}}
    _write(cache.path, json.dumps(data))
    with pytest.warns(TuningCacheWarning, match="median_s"):
        dispatch(24, 20, 16)
    assert doctor.decide(op, "cpu").chosen.source == "hero"


def test_space_membership_is_strict_about_types_and_extras():
    from tracea.semantic.search_space import SearchSpace

    space = SearchSpace().tile_m([16, 32]).warps([1]).param("threads", [0, 1])
    assert space.contains(PipelineConfig(tile_m=16, warps=1, params=(("threads", 1),)))
    assert not space.contains(PipelineConfig(tile_m=16, warps=1, params=(("threads", True),)))
    assert not space.contains(PipelineConfig(tile_m=16, warps=1, params=(("threads", 1.0),)))
    assert not space.contains(PipelineConfig(tile_m=16, warps=1, params=(("threads", 1), ("kc", 8))))
    assert not space.contains(PipelineConfig(tile_m=16, tile_n=8, warps=1, params=(("threads", 1),)))


def test_tuner_retunes_over_an_ignored_entry_and_skips_it_as_a_seed(doctor, cache):
    import tracea_tuning_testplugin as plugin
    from tracea.tuning.autotuner import AutoTuner

    op = GemmOp(24, 24, 24)
    bad = PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1, params=(("sleep_s", 30.0),))
    old = _entry(cache, doctor, op, bad, median_s=1e-9)
    assert cache.put(old)
    tuner = AutoTuner(doctor=doctor, trials=3, cache=cache, seed=0, sampler="random", progress=False,
                      warmup=0, min_repeats=1, max_repeats=1, budget_s=0.0)
    with pytest.warns(TuningCacheWarning, match="ignoring tuning-cache entry"):
        res = tuner.tune(op, "cpu", V)
    assert not res.from_cache and bad.key not in plugin.RUNS
    assert all(t.config != bad for t in res.history)
    stored = cache.lookup(op, V, doctor.profile_for("cpu"))
    assert stored is not None and stored.config != bad


# -- 4. the CLI renders hostile entries ----------------------------------------------------------
@pytest.mark.parametrize("field,value", [("tuned_at", 1e20), ("tuned_at", -1e15), ("p90_s", 1e300),
                                         ("device_name", "x" * 4000), ("env", {"k": "\u202e\x00\n"})])
def test_every_cache_command_survives_hostile_values(doctor, cache, tmp_path, capsys, field, value):
    from tracea.cli.main import main

    keys = _good_file(cache, doctor, 2)
    data = json.load(open(cache.path))
    data["entries"][keys[0]][field] = value
    _write(cache.path, json.dumps(data))
    c = ["cache", "--cache", cache.path]
    assert main(c + ["ls"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and ("?(" in out if field == "tuned_at" else True)
    assert main(c + ["ls", "--json"]) == 0 and len(json.loads(capsys.readouterr().out)) == 2
    assert main(c + ["show", "0"]) == 0 and main(c + ["show", "1", "--json"]) == 0
    assert main(c + ["show", "\u00b2"]) == 1  # a digit that int() refuses: looked up as text
    assert main(c + ["export", str(tmp_path / "x.json")]) == 0
    assert main(c + ["import", str(tmp_path / "x.json"), "--replace"]) == 0
    assert main(c + ["clear", "--stale", "--yes"]) == 0 and main(c + ["clear", "--yes"]) == 0
    assert len(TuningCache(cache.path)) == 0


def test_import_of_a_missing_or_hostile_file_is_a_clean_error(doctor, cache, tmp_path, capsys):
    from tracea.cli.main import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["cache", "--cache", cache.path, "import", str(tmp_path / "missing.json")]) == 2
    for path in (fifo, tmp_path):
        with pytest.warns(TuningCacheWarning, match="not a regular file"):
            assert main(["cache", "--cache", cache.path, "import", str(path)]) == 2
    assert os.path.exists(fifo) and "not a readable Tracea tuning cache" in capsys.readouterr().err


# -- 5. files that are not regular files ---------------------------------------------------------
def _never_blocks(fn, timeout=20.0):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked"
    return box.get("r")


def test_fifo_is_ignored_never_read_never_replaced(doctor, cache, dispatch):
    os.makedirs(os.path.dirname(cache.path), exist_ok=True)
    os.mkfifo(cache.path)
    with pytest.warns(TuningCacheWarning, match="FIFO"):
        _never_blocks(dispatch)
        assert _never_blocks(lambda: cache.put(_entry(cache, doctor, GemmOp(8, 8, 8)))) is False
    assert os.path.exists(cache.path) and not os.path.isfile(cache.path) and not _aside(cache)
    assert cache.lookup(GemmOp(8, 8, 8), V, doctor.profile_for("cpu")) is not None  # kept in memory


def test_directory_is_ignored_and_left_alone(doctor, cache, dispatch):
    os.makedirs(cache.path)
    _write(os.path.join(cache.path, "mine.txt"), "user data")
    with pytest.warns(TuningCacheWarning, match="directory"):
        dispatch()
        assert cache.put(_entry(cache, doctor, GemmOp(8, 8, 8))) is False
    assert open(os.path.join(cache.path, "mine.txt")).read() == "user data"


def test_symlink_loop_is_ignored(doctor, cache, dispatch):
    os.makedirs(os.path.dirname(cache.path), exist_ok=True)
    os.symlink(cache.path + ".b", cache.path)
    os.symlink(cache.path, cache.path + ".b")
    with pytest.warns(TuningCacheWarning, match="symbolic links"):
        dispatch()
        assert cache.put(_entry(cache, doctor, GemmOp(8, 8, 8))) is False
    assert os.path.islink(cache.path)


def test_symlinked_cache_is_written_through_the_link(doctor, tmp_path):
    target = tmp_path / "real" / "cache.json"
    os.makedirs(target.parent)
    link = tmp_path / "link.json"
    os.symlink(target, link)
    cache = TuningCache(link)
    keys = _good_file(cache, doctor, 2)
    assert os.path.islink(link) and sorted(json.load(open(target))["entries"]) == sorted(keys)


def test_unreadable_file_is_left_alone_and_not_overwritten(doctor, cache, dispatch, monkeypatch):
    keys = _good_file(cache, doctor, 1)
    real_open = os.open

    def denied(path, *a, **kw):  # chmod 000 does not stop root, so deny the cache's reads here
        if os.fspath(path) == cache.path and not (a and a[0] & (os.O_WRONLY | os.O_RDWR)):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(cache_file.os, "open", denied)
    with pytest.warns(TuningCacheWarning, match="Permission denied"):
        dispatch()
        assert TuningCache(cache.path).put(_entry(cache, doctor, GemmOp(8, 8, 8))) is False
    monkeypatch.undo()
    assert list(json.load(open(cache.path))["entries"]) == keys and not _aside(cache)


def test_oversized_file_is_moved_aside_unread(doctor, cache, dispatch, monkeypatch):
    _good_file(cache, doctor, 1)
    monkeypatch.setattr(cache_file, "MAX_BYTES", 64)
    with pytest.warns(TuningCacheWarning, match="moved it to"):
        dispatch()
    assert len(_aside(cache)) == 1 and not os.path.exists(cache.path)


@pytest.mark.parametrize("data", [b"\xff\xfe{}", b'{"format": "tracea-tuning-cache", "entries": {"\xc3\x28": 1}}'])
def test_non_utf8_is_corrupt(doctor, cache, dispatch, data):
    _write(cache.path, data)
    with pytest.warns(TuningCacheWarning, match="UTF-8"):
        dispatch()
    assert [open(p, "rb").read() for p in _aside(cache)] == [data]


# -- 6. good entries are never lost --------------------------------------------------------------
@pytest.mark.parametrize("damage", ["missing-config", "huge-int", "key-mismatch", "not-an-object", "bad-goal"])
def test_malformed_entries_are_copied_aside_and_good_ones_kept(doctor, cache, damage):
    keys = _good_file(cache, doctor, 3)
    text = open(cache.path).read()
    data = json.loads(text)
    bad = data["entries"][keys[1]]
    if damage == "missing-config":
        del bad["config"]
    elif damage == "huge-int":
        bad["config"]["tile_m"] = "@HUGE@"
    elif damage == "key-mismatch":
        bad["op_key"] = "gemm:other"
    elif damage == "not-an-object":
        data["entries"][keys[1]] = [1, 2]
    else:
        bad["goal"] = {"x": 1}
    text = json.dumps(data).replace('"@HUGE@"', "9" * 5000)
    _write(cache.path, text)
    with pytest.warns(TuningCacheWarning, match="malformed"):
        got = sorted(e.key for e in TuningCache(cache.path).entries())
    assert got == sorted([keys[0], keys[2]])
    assert [open(p).read() for p in _aside(cache)] == [text]


def test_duplicate_keys_are_reported_and_the_file_kept_aside(doctor, cache):
    keys = _good_file(cache, doctor, 1)
    text = open(cache.path).read()
    entry = json.dumps(json.loads(text)["entries"][keys[0]])
    dup = text.replace('"entries": {', '"entries": {%s: %s, ' % (json.dumps(keys[0]), entry), 1)
    _write(cache.path, dup)
    with pytest.warns(TuningCacheWarning, match="duplicate key"):
        assert [e.key for e in TuningCache(cache.path).entries()] == keys
    assert [open(p).read() for p in _aside(cache)] == [dup]


def test_put_keeps_entries_other_instances_wrote_meanwhile(doctor, cache):
    first = _good_file(cache, doctor, 1)
    other = TuningCache(cache.path)
    len(other)  # loaded before the next write
    second = _entry(cache, doctor, GemmOp(40, 40, 40))
    assert cache.put(second)
    third = _entry(other, doctor, GemmOp(48, 48, 48))
    assert other.put(third)
    assert sorted(json.load(open(cache.path))["entries"]) == sorted(first + [second.key, third.key])


def test_a_file_replaced_while_a_reader_reads_it_is_not_taken_for_the_one_read(doctor, cache, monkeypatch):
    """A reader (no lock) reads the file, and another process replaces it before the reader notes which
    file it read: the reader must not take the new file for the one it holds, or its next put writes back
    its older copy and drops the other's entry (seen once in the 3-process CI fuzz: 1 of 32 lost)."""
    first = _good_file(cache, doctor, 1)
    other = TuningCache(cache.path)
    reader = TuningCache(cache.path)
    real = cache_file.load
    raced: list[str] = []

    def racing(path, *args, **kwargs):
        loaded = real(path, *args, **kwargs)
        if not raced and not kwargs.get("locked"):
            third = _entry(other, doctor, GemmOp(48, 48, 48))
            raced.append(third.key)
            assert other.put(third)  # replaces the file right after the reader read it
        return loaded

    monkeypatch.setattr(cache_file, "load", racing)
    len(reader)  # the unlocked read
    monkeypatch.setattr(cache_file, "load", real)
    mine = _entry(reader, doctor, GemmOp(56, 56, 56))
    assert raced and reader.put(mine)
    assert sorted(json.load(open(cache.path))["entries"]) == sorted(first + raced + [mine.key])


def test_a_good_file_written_meanwhile_is_not_moved_aside(doctor, cache, monkeypatch):
    """The reader judged a corrupt file, but a writer replaced it with a good one before the reader
    got the lock: the good file stays."""
    keys = _good_file(cache, doctor, 1)
    good = open(cache.path, "rb").read()
    _write(cache.path, b"{corrupt")
    real = cache_file.read_bytes
    calls = []

    def racing(path):
        calls.append(path)
        if len(calls) == 2:  # the re-read under the lock sees the writer's file
            _write(cache.path, good)
        return real(path)

    monkeypatch.setattr(cache_file, "read_bytes", racing)
    assert list(cache_file.load(cache.path).entries) == keys
    assert not _aside(cache) and open(cache.path, "rb").read() == good


def test_graph_tuning_takes_no_hostile_seed_from_the_cache(doctor, cache):
    import tracea_tuning_testplugin as plugin
    from tracea.tuning.graph import optimize_graph

    bad = PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1, params=(("sleep_s", 30.0),))
    assert cache.put(_entry(cache, doctor, GemmOp(96, 96, 96), bad))
    with pytest.warns(TuningCacheWarning, match="ignoring tuning-cache entry"):
        report = optimize_graph([GemmOp(96, 96, 80)], iterations=2, doctor=doctor, cache=cache, progress=False,
                                seed=0)
    assert bad.key not in plugin.RUNS and report.entries[0].seeded_from == []
