"""The write counter on ``os.environ`` (``tracea.runtime.env_watch``) that lets the plan cache re-read the
steering variables only after a write: every way of writing counts, reads don't, ``os.environ`` behaves as
before, and the plan cache still sees every steering change on the next call (also without the counter)."""

from __future__ import annotations

import os

import pytest

from tracea.runtime import env_watch, plans


def test_every_write_method_counts_and_reads_do_not():
    d = env_watch.CountingDict({b"A": b"1"})
    n = env_watch.WRITES[0]
    writes = [lambda: d.__setitem__(b"B", b"2"), lambda: d.__delitem__(b"B"), lambda: d.update({b"C": b"3"}),
              lambda: d.setdefault(b"D", b"4"), lambda: d.pop(b"D"), lambda: d.pop(b"missing", None),
              lambda: d.popitem(), lambda: d.__ior__({b"E": b"5"}), lambda: d.clear()]
    for i, write in enumerate(writes, 1):
        write()
        assert env_watch.WRITES[0] == n + i, i
    d[b"F"] = b"6"
    n = env_watch.WRITES[0]
    assert d[b"F"] == b"6" and d.get(b"G") is None and b"F" in d and list(d) == [b"F"] and len(d) == 1
    assert env_watch.WRITES[0] == n
    with pytest.raises(KeyError):
        d.pop(b"missing")


def test_os_environ_writes_count_and_behave_as_before(monkeypatch):
    assert env_watch.install() and env_watch.install()  # (once; idempotent)
    assert type(os.environ._data) is env_watch.CountingDict  # type: ignore[attr-defined]
    n = env_watch.WRITES[0]
    monkeypatch.setenv("TRACEA_TEST_ENV_WATCH", "x")
    assert os.environ["TRACEA_TEST_ENV_WATCH"] == "x" and os.getenv("TRACEA_TEST_ENV_WATCH") == "x"
    assert env_watch.WRITES[0] > n
    if hasattr(os, "environb"):  # shares the data dict on POSIX: both views agree
        assert os.environb[b"TRACEA_TEST_ENV_WATCH"] == b"x"
        os.environb[b"TRACEA_TEST_ENV_WATCH"] = b"y"
        assert os.environ["TRACEA_TEST_ENV_WATCH"] == "y"
    n = env_watch.WRITES[0]
    monkeypatch.delenv("TRACEA_TEST_ENV_WATCH")
    assert "TRACEA_TEST_ENV_WATCH" not in os.environ and env_watch.WRITES[0] > n
    assert isinstance(os.environ.copy(), dict)


@pytest.mark.parametrize("watched", [True, False], ids=["counted", "read-every-call"])
def test_generation_moves_on_a_steering_write_only(monkeypatch, watched):
    monkeypatch.setattr(plans, "_WATCHED", watched)
    g = plans.generation()
    monkeypatch.setenv("TRACEA_TEST_UNRELATED", "1")  # a write, but no steering variable changed
    assert plans.generation() == g
    monkeypatch.setenv("TRACEA_ARBITER", "0" if os.environ.get("TRACEA_ARBITER") != "0" else "1")
    g2 = plans.generation()
    assert g2 != g and plans.generation() == g2
    monkeypatch.undo()
    assert plans.generation() != g2  # back to the old value: a change again
