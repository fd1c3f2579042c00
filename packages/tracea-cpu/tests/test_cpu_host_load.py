"""Threads per call on a busy host (``tracea_cpu.host_load``): the other processes' busy cores from a
``/proc/stat`` written by the test, the cap and its rounding, the settings that turn it off, and every
launcher that asks it (fp32 GEMM and conv2d, bf16 and AMX GEMM, AMX conv2d) computing the float64
reference's result whatever thread count each call gets."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import tracea
from tracea_cpu import host_load, kernels
from tracea_cpu.host_load import FreeCores, adaptive, thread_picker
from tracea_cpu.testing import HAVE_CC, PROFILE

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")


def _stat(path, busy_ticks: int, idle_ticks: int, cpus: int = 4) -> None:
    """A /proc/stat with the aggregate line split as user / system and ``cpus`` per-CPU lines (not read:
    the host's CPU count comes from ``os.cpu_count``)."""
    lines = [f"cpu  {busy_ticks - busy_ticks // 4} 0 {busy_ticks // 4} {idle_ticks} 0 0 0 0 0 0"]
    lines += [f"cpu{i} 1 0 1 1 0 0 0 0 0 0" for i in range(cpus)]
    lines.append("intr 0")
    path.write_text("\n".join(lines) + "\n")


def _busy(path) -> int:
    """user + system ticks of the aggregate line of a stat file written by :func:`_stat`."""
    fields = path.read_text().split()
    return int(fields[1]) + int(fields[3])


class _Clock:
    def __init__(self) -> None:
        self.wall = 100.0
        self.ours = 5.0


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(host_load.time, "monotonic", lambda: c.wall)
    monkeypatch.setattr(host_load.time, "process_time", lambda: c.ours)
    monkeypatch.setattr(host_load.os, "cpu_count", lambda: 4)  # a 4-CPU host whatever runs the test
    return c


def test_other_processes_busy_cores(tmp_path, clock):
    stat = tmp_path / "stat"
    _stat(stat, 1000, 5000)
    free = FreeCores(str(stat))
    tick = free._tick
    assert free.others() == 0.0  # first sample: nothing to compare yet
    # 0.5 s later: the host was busy 1.5 CPU-s, 0.5 of them ours -> others kept 2 cores busy
    clock.wall += 0.5
    clock.ours += 0.5
    _stat(stat, 1000 + int(1.5 * tick), 5000)
    assert free.others() == pytest.approx(2.0)  # the first window is the estimate
    clock.wall += 0.5
    clock.ours += 0.5
    busy = _busy(stat)
    _stat(stat, busy + int(0.5 * tick), 5000)  # others idle now: averaged with the previous window
    assert free.others() == pytest.approx(host_load.NEW_WEIGHT * 0.0 + (1 - host_load.NEW_WEIGHT) * 2.0)
    for _ in range(12):  # busy again for a while: the estimate converges to 2 busy cores
        clock.wall += 0.5
        clock.ours += 0.5
        busy = _busy(stat)
        _stat(stat, busy + int(1.5 * tick), 5000)
        free.others()
    assert free.others() == pytest.approx(2.0, abs=0.01)
    assert free._cpus == 4  # the host's CPUs: os.cpu_count()
    assert free.cap(4) == 2 and free.cap(2) == 2 and free.cap(1) == 1


def test_window_reuses_the_estimate(tmp_path, clock):
    stat = tmp_path / "stat"
    _stat(stat, 0, 0, cpus=2)
    free = FreeCores(str(stat))
    free.others()
    clock.wall += host_load.WINDOW_S / 2
    _stat(stat, 10_000, 0, cpus=2)  # not read: the window has not passed
    assert free.others() == 0.0
    clock.wall += host_load.WINDOW_S
    assert free.others() > 0.0


@pytest.mark.parametrize("others,nth,expected", [(0.0, 2, 2), (0.4, 2, 2), (0.6, 2, 1), (1.0, 2, 1), (2.0, 2, 1),
                                                 (3.0, 16, 13), (15.7, 16, 1), (0.0, 1, 1),
                                                 (0.0, 24, 24), (1.0, 24, 15)])
def test_cap_rounds_the_free_cores(others, nth, expected, tmp_path):
    free = FreeCores(str(tmp_path / "missing"))
    free.others = lambda: others  # type: ignore[method-assign]
    free._cpus = 2 if nth <= 2 else 16  # 24 threads on 16 cores: torch's count above the host's
    assert free.cap(nth) == expected


def test_unreadable_stat_caps_nothing(tmp_path):
    free = FreeCores(str(tmp_path / "missing"))
    assert free.others() is None and free.cap(8) == 8
    (tmp_path / "garbage").write_text("nothing here\n")
    assert FreeCores(str(tmp_path / "garbage")).cap(8) == 8


def test_only_automatic_counts_are_capped(monkeypatch):
    monkeypatch.delenv("TRACEA_NUM_THREADS", raising=False)
    monkeypatch.delenv("TRACEA_CPU_ADAPT_THREADS", raising=False)
    assert adaptive(0) and not adaptive(2)
    monkeypatch.setenv("TRACEA_NUM_THREADS", "2")
    assert not adaptive(0)
    monkeypatch.delenv("TRACEA_NUM_THREADS")
    monkeypatch.setenv("TRACEA_CPU_ADAPT_THREADS", "0")
    assert not adaptive(0)
    assert thread_picker(4, 0)() == host_load.team(4)  # torch's team (or the widest count), uncapped


class _Alternating:
    """A stand-in for the busy-core estimate: every call gets 1, then all, then 1 ... threads."""

    def __init__(self) -> None:
        self.calls = 0
        self._flip = itertools.cycle((True, False))

    def cap(self, nth: int) -> int:
        self.calls += 1
        return 1 if next(self._flip) else nth


@pytest.fixture
def alternating(monkeypatch):
    monkeypatch.delenv("TRACEA_NUM_THREADS", raising=False)
    monkeypatch.delenv("TRACEA_CPU_ADAPT_THREADS", raising=False)
    stub = _Alternating()
    monkeypatch.setattr(host_load, "_FREE", stub)
    return stub


@needs_cc
def test_fp32_gemm_and_conv_with_changing_thread_counts(alternating):
    rng = np.random.default_rng(3)
    # odd shapes no other test binds, so the launchers are bound here, with the stand-in
    a, b = rng.standard_normal((203, 157)).astype(np.float32), rng.standard_normal((157, 331)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for _ in range(4):
        got = tracea.ops.matmul(a, b)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
    x = rng.standard_normal((2, 19, 23, 21)).astype(np.float32)
    w = rng.standard_normal((29, 19, 3, 3)).astype(np.float32)
    torch = pytest.importorskip("torch")
    cref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    for _ in range(4):
        np.testing.assert_allclose(tracea.ops.conv2d(x, w, padding=1), cref, rtol=1e-4, atol=1e-3)
    assert alternating.calls >= 8 or PROFILE.compute_units == 1  # one core: nothing to cap


def _amx_ready() -> str | None:
    from tracea_cpu.amx import amx_permission

    if not HAVE_CC:
        return "no C compiler"
    if not PROFILE.has("amx_tile", "amx_bf16"):
        return "this CPU lacks AMX-BF16 (amx_tile, amx_bf16)"
    return amx_permission()


@pytest.mark.skipif(_amx_ready() is not None, reason=str(_amx_ready()))
def test_amx_gemm_and_conv_with_changing_thread_counts(alternating):
    torch = pytest.importorskip("torch")
    pytest.importorskip("tracea_torch")
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(301, 219, generator=gen).bfloat16()
    b = torch.randn(219, 173, generator=gen).bfloat16()
    ref = a.double() @ b.double()
    for _ in range(4):  # the second sighting of b packs its panels, later calls read them
        got = tracea.ops.matmul(a, b, out_dtype="float32")
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 35, 13, 11, generator=gen).bfloat16().to(memory_format=torch.channels_last)
    w = torch.randn(37, 35, 3, 3, generator=gen).bfloat16().to(memory_format=torch.channels_last)
    cref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    for _ in range(4):
        got = tracea.ops.conv2d(x, w, padding=1, out_dtype="float32")
        torch.testing.assert_close(got.double(), cref, rtol=1e-5, atol=1e-4)
    assert alternating.calls >= 8 or PROFILE.compute_units == 1  # one core: nothing to cap


def test_automatic_counts_follow_torchs_team(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("TRACEA_NUM_THREADS", raising=False)
    monkeypatch.setenv("TRACEA_CPU_ADAPT_THREADS", "0")
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert host_load.team(2) == 3 and thread_picker(2, 0)() == 3
        torch.set_num_threads(2)  # read at every call, not when the launcher was bound
        assert thread_picker(5, 0)() == 2
        assert thread_picker(1, 0)() == 1 and thread_picker(4, 4)() == 4  # serial calls; a config's own count
        monkeypatch.setenv("TRACEA_NUM_THREADS", "4")
        assert thread_picker(4, 0)() == 4
    finally:
        torch.set_num_threads(old)


def test_without_torch_the_widest_automatic_count_is_the_team(monkeypatch):
    monkeypatch.setattr(host_load, "imported", lambda name: None)
    monkeypatch.setattr(host_load, "_widest", 1)
    assert host_load.team(4) == 4 and host_load.team(2) == 4 and host_load.team(6) == 6
    monkeypatch.setattr(host_load, "_widest", 10 ** 6)
    assert host_load.team(2) == kernels.max_threads()


def _threads() -> set[int]:
    """Thread ids of this process now."""
    return {int(t) for t in os.listdir("/proc/self/task")}


@needs_cc
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc/self/task to list threads")
def test_tracea_calls_between_torch_ops_start_no_threads(monkeypatch):
    """libgomp ends a pool's surplus threads when a region asks for fewer and starts new ones for the next
    larger region: Tracea's automatic count (every core) against torch's (one more here) did that at every
    switch. Now the threads that run the calls are the same ones throughout."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("TRACEA_NUM_THREADS", raising=False)
    monkeypatch.setenv("TRACEA_CPU_ADAPT_THREADS", "0")
    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(192, 160, generator=gen), torch.randn(160, 224, generator=gen)
    ref = a.double() @ b.double()
    big = torch.zeros(1 << 22)  # an elementwise op this large runs on every torch thread
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(PROFILE.compute_units + 1)
        for _ in range(3):
            tracea.ops.matmul(a, b)
            big.add_(1.0)
        before, seen = _threads(), set()
        for _ in range(10):
            big.add_(1.0)
            seen |= _threads()
            got = tracea.ops.matmul(a, b)
            seen |= _threads()
        assert seen == before, f"{len(seen - before)} threads started, {len(before - seen)} ended"
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-3)
