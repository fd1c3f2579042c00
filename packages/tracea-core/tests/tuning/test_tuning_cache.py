import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tracea.ir import GemmOp
from tracea.semantic.config import PipelineConfig
from tracea.tuning.cache import TuningCache, TuningCacheWarning, default_path, get_cache, set_cache
from tracea.tuning.goals import OptimizationGoal

STATS = {"median_s": 1e-4, "p90_s": 1.2e-4, "cv": 0.05}


def _variant(doctor, name="testnp.gemm.blocked"):
    return next(v for v in doctor.variants() if v.name == name)


def _put(cache, doctor, op, tile=32, goal=None):
    v = _variant(doctor)
    prof = doctor.profile_for("cpu")
    e = cache.make_entry(op, v, prof, PipelineConfig(tile_m=tile, warps=1), STATS, goal=goal, trials=3)
    assert cache.put(e)
    return e


def test_put_persists_and_a_new_instance_reads_it(doctor, cache):
    op = GemmOp(64, 48, 32)
    e = _put(cache, doctor, op)
    fresh = TuningCache(cache.path)
    hit = fresh.lookup(op, "testnp.gemm.blocked", doctor.profile_for("cpu"))
    assert hit is not None and hit.config == e.config and hit.median_s == 1e-4
    assert hit.variant == "testnp.gemm.blocked"
    assert fresh.best(op, doctor.profile_for("cpu")).config == e.config
    assert fresh.lookup(GemmOp(64, 48, 33), "testnp.gemm.blocked", doctor.profile_for("cpu")) is None
    data = json.load(open(cache.path))
    assert data["format"] == "tracea-tuning-cache" and len(data["entries"]) == 1


def test_puts_read_the_file_again_only_after_another_writer(doctor, cache, monkeypatch):
    """A put re-reads (parses and validates) the file only when it changed since this instance last read
    or wrote it; entries another instance wrote meanwhile are kept, and one entry per line is written."""
    from tracea.tuning import cache_file

    loads = []
    real = cache_file.load
    monkeypatch.setattr(cache_file, "load", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    _put(cache, doctor, GemmOp(64, 48, 32))
    before = len(loads)
    for n in (40, 41, 42):
        _put(cache, doctor, GemmOp(n, 48, 32))
    assert len(loads) == before, "unchanged file parsed again"
    other = TuningCache(cache.path)
    _put(other, doctor, GemmOp(50, 48, 32))
    _put(cache, doctor, GemmOp(51, 48, 32))
    assert len(loads) > before
    data = json.load(open(cache.path))
    assert len(data["entries"]) == 6 and len(open(cache.path).read().splitlines()) == 8


def test_goal_specific_entries_and_default_lookup(doctor, cache):
    op = GemmOp(64, 48, 32)
    prof = doctor.profile_for("cpu")
    _put(cache, doctor, op, tile=16, goal=OptimizationGoal.MinimizeLatency)
    assert cache.lookup(op, "testnp.gemm.blocked", prof, OptimizationGoal.MaximizeTFLOPS) is None
    assert cache.lookup(op, "testnp.gemm.blocked", prof).config.tile_m == 16  # any goal when none asked
    _put(cache, doctor, op, tile=64)
    assert cache.lookup(op, "testnp.gemm.blocked", prof).config.tile_m == 64
    assert cache.lookup(op, "testnp.gemm.blocked", prof, "min_latency").config.tile_m == 16


def test_fingerprint_change_misses_but_keeps_old_entry_as_seed(doctor, cache):
    op = GemmOp(64, 48, 32)
    _put(cache, doctor, op)
    prof = doctor.profile_for("cpu")
    new_driver = prof.with_(runtime_version="changed-runtime")
    assert cache.lookup(op, "testnp.gemm.blocked", new_driver) is None
    assert [s.config.tile_m for s in cache.stale(op, "testnp.gemm.blocked")] == [32]
    os.environ["TESTNP_ENV"] = "2"  # a plugin's tracea_environment fact changes
    try:
        cache.forget_fingerprints()
        assert cache.lookup(op, "testnp.gemm.blocked", prof) is None
    finally:
        del os.environ["TESTNP_ENV"]
        cache.forget_fingerprints()
    assert cache.lookup(op, "testnp.gemm.blocked", prof) is not None


def test_source_hash_is_part_of_the_fingerprint(doctor, cache):
    op = GemmOp(64, 48, 32)
    v = _variant(doctor)
    prof = doctor.profile_for("cpu")
    cache.put(cache.make_entry(op, v, prof, PipelineConfig(warps=1), STATS))
    v.source_hash = lambda op: "v2-of-the-kernel"
    try:
        cache.forget_fingerprints()
        assert cache.lookup(op, v, prof) is None
    finally:
        del v.source_hash
        cache.forget_fingerprints()


@pytest.mark.parametrize("damage", [b'{"format": "tracea-tuning-cache", "version": 1, "entr', b"", b"\xff\xfe",
                                    b'[1, 2]'])
def test_corrupt_file_is_reported_moved_aside_and_survived(doctor, cache, damage):
    os.makedirs(os.path.dirname(cache.path), exist_ok=True)
    with open(cache.path, "wb") as f:
        f.write(damage)
    op = GemmOp(64, 48, 32)
    with pytest.warns(TuningCacheWarning, match="tuning_cache.json"):
        assert cache.lookup(op, "testnp.gemm.blocked", doctor.profile_for("cpu")) is None
    aside = glob.glob(cache.path + ".corrupt-*")
    assert len(aside) == 1 and open(aside[0], "rb").read() == damage
    _put(cache, doctor, op)
    assert TuningCache(cache.path).lookup(op, "testnp.gemm.blocked", doctor.profile_for("cpu")) is not None


def test_truncation_after_load_keeps_entries_known_to_this_process(doctor, cache):
    a, b = GemmOp(64, 48, 32), GemmOp(32, 32, 32)
    _put(cache, doctor, a)
    cache.reload()
    text = open(cache.path).read()
    with open(cache.path, "w") as f:
        f.write(text[: len(text) // 2])
    cache._state = None  # the damage happened "behind our back"; force a re-read on the next put
    with pytest.warns(TuningCacheWarning, match="moved it to"):
        _put(cache, doctor, b)
    fresh = TuningCache(cache.path)
    prof = doctor.profile_for("cpu")
    assert fresh.lookup(a, "testnp.gemm.blocked", prof) is not None  # not silently lost
    assert fresh.lookup(b, "testnp.gemm.blocked", prof) is not None


def test_malformed_entries_are_dropped_with_a_copy_and_good_ones_kept(doctor, cache):
    op = GemmOp(64, 48, 32)
    _put(cache, doctor, op)
    data = json.load(open(cache.path))
    data["entries"]["junk"] = {"no": "config"}
    json.dump(data, open(cache.path, "w"))
    fresh = TuningCache(cache.path)
    with pytest.warns(TuningCacheWarning, match="malformed"):
        assert fresh.lookup(op, "testnp.gemm.blocked", doctor.profile_for("cpu")) is not None
    assert glob.glob(cache.path + ".corrupt-*")


def test_unwritable_location_warns_and_keeps_memory(doctor, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = TuningCache(blocker / "sub" / "c.json")  # parent is a file: cannot be created
    op = GemmOp(64, 48, 32)
    with pytest.warns(TuningCacheWarning, match="could not"):
        v = _variant(doctor)
        assert not cache.put(cache.make_entry(op, v, doctor.profile_for("cpu"), PipelineConfig(warps=1), STATS))
    assert cache.lookup(op, v, doctor.profile_for("cpu")) is not None


def test_remove_export_import(doctor, cache, tmp_path):
    a, b = GemmOp(64, 48, 32), GemmOp(32, 32, 32)
    _put(cache, doctor, a)
    _put(cache, doctor, b)
    out = tmp_path / "export.json"
    assert cache.export(str(out), [e for e in cache.entries() if "m=64" in e.op_key]) == 1
    assert cache.remove(lambda e: "m=64" in e.op_key) == 1
    assert len(cache) == 1
    assert cache.import_file(str(out)) == 1
    assert len(TuningCache(cache.path)) == 2
    assert cache.clear() == 2 and len(TuningCache(cache.path)) == 0


def test_default_cache_location_follows_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEA_CACHE_PATH", raising=False)
    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path / "d"))
    set_cache(None)
    assert get_cache().path == str(tmp_path / "d" / "tuning_cache.json") == default_path()
    monkeypatch.setenv("TRACEA_CACHE_PATH", str(tmp_path / "x.json"))
    assert get_cache().path == str(tmp_path / "x.json")
    custom = TuningCache(tmp_path / "custom.json")
    set_cache(custom)
    assert get_cache() is custom
    set_cache(None)


WRITER = textwrap.dedent("""
    import sys
    import tracea_tuning_testplugin as t
    from tracea.ir import GemmOp
    from tracea.semantic.config import PipelineConfig
    from tracea.tuning.cache import get_cache
    d = t.make_doctor()
    v = [x for x in d.variants() if x.name == "testnp.gemm.blocked"][0]
    prof = d.profile_for("cpu")
    cache = get_cache()
    who = int(sys.argv[1])
    for i in range(25):
        op = GemmOp(16 + who, 16 + i, 16)
        cache.put(cache.make_entry(op, v, prof, PipelineConfig(tile_m=16, warps=1),
                                   {"median_s": 1e-5 * (i + 1)}, trials=1))
""")


def test_concurrent_writers_lose_no_update(subprocess_env, tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w)], env=subprocess_env) for w in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    cache = TuningCache(subprocess_env["TRACEA_CACHE_PATH"])
    assert len(cache) == 75
    assert not glob.glob(str(tmp_path / "*.tmp-*"))


def test_variants_fingerprint_their_code_by_default(doctor, cache, monkeypatch):
    """Without a source_hash of its own a variant's fingerprint covers its package's Python sources
    (``KernelVariant.source_hash``): an entry tuned on older code of the same version misses."""
    from tracea.doctor import variant as variant_module
    from tracea.doctor.code_hash import module_source_hash

    op = GemmOp(64, 48, 32)
    v = _variant(doctor)
    prof = doctor.profile_for("cpu")
    assert v.source_hash() == module_source_hash(type(v).__module__) != ""
    cache.put(cache.make_entry(op, v, prof, PipelineConfig(warps=1), STATS))
    cache.forget_fingerprints()
    assert cache.lookup(op, v, prof) is not None
    monkeypatch.setattr(variant_module, "module_source_hash", lambda module: "the code after an edit")
    cache.forget_fingerprints()
    assert cache.lookup(op, v, prof) is None
    monkeypatch.undo()
    cache.forget_fingerprints()
    assert cache.lookup(op, v, prof) is not None
