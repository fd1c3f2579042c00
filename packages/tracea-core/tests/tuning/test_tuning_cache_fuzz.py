"""The tuning-cache fuzzer in CI: a short seeded run must find nothing, several processes sharing a
cache must lose nothing, and the harness must attribute crashes and hangs to their case."""

import itertools
import time

import pytest

pytest.importorskip("tracea_cpu.plugin")

from tracea.testing import fuzz_cache  # noqa: E402
from tracea.testing.fuzz_cache import concurrency, oracle  # noqa: E402
from tracea.testing.fuzz_cache.runner import run_batch  # noqa: E402

FAMILIES = {"file", "entry", "config", "param", "text", "nesting", "duplicate", "path", "clean"}


def test_short_fuzz_run_finds_nothing(tmp_path):
    start = time.monotonic()
    summary = fuzz_cache.run(cases=36, seed=20261124, report_path=str(tmp_path / "report.json"), batch=36,
                             concurrency=False)
    print(summary.table())
    assert summary.cases == 36 and set(summary.kinds) == FAMILIES
    assert summary.ok, summary.table()
    assert time.monotonic() - start < 60


def test_processes_and_threads_sharing_a_cache_lose_nothing(tmp_path):
    result = concurrency.run(str(tmp_path), processes=3, threads=2, iterations=5)
    assert result["entries"] >= 3 * 2 * 5 and not result["problems"], result


def test_case_stream_is_seeded_and_covers_every_family():
    first = list(itertools.islice(fuzz_cache.case_stream(3), 500))
    assert first == list(itertools.islice(fuzz_cache.case_stream(3), 500))
    assert first != list(itertools.islice(fuzz_cache.case_stream(4), 500))
    assert {r["kind"].split("/")[0] for r in first} == FAMILIES
    assert any(r.get("path") == "huge" for r in first)


def test_a_crash_and_a_hang_are_attributed_to_their_case():
    recipes = [{"id": 0, "kind": "clean"}, {"id": 1, "kind": "self/crash", "selftest": "crash"},
               {"id": 2, "kind": "clean"}, {"id": 3, "kind": "self/hang", "selftest": "hang"}, {"id": 4, "kind": "clean"}]
    results = run_batch(recipes, case_timeout=5, confirm=False)
    assert [r.outcome for r in results] == ["ok", "crash", "ok", "hang", "ok"]
    assert "SIGABRT" in results[1].detail and not results[0].findings and not results[4].findings


def test_oracle_rules():
    good = b'{"format": "tracea-tuning-cache", "version": 1, "entries": {"k": {}}}'
    assert oracle.classify(good) == (oracle.ENTRIES, {"k": {}})
    assert oracle.classify(good.replace(b"1,", b'"1",'))[0] == oracle.FILE
    assert oracle.classify(good.replace(b'{"k": {}}', b'{"k": {}, "k": {}}'))[0] == oracle.DUPLICATES
    assert oracle.classify(good.replace(b"{}}", b"[" * 70 + b"]" * 70 + b"}"))[0] == oracle.FILE
    assert oracle.classify(good.replace(b"1,", b"9" * 5000 + b","))[0] == oracle.ENTRIES
    assert oracle.classify(b"\xff")[0] == oracle.classify(b"")[0] == oracle.FILE
