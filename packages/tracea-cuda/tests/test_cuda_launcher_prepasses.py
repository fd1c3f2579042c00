"""``launcher.with_prepasses`` and ``launcher.pair_launch`` on the CPU with stand-ins (no GPU): one scratch
buffer per call inside capture (both regions, the second aligned), the stream's kept buffer outside it,
one pre-pass launch reading both operands and writing the two regions, then the inner launcher's pointer
form on the regions, all on the getter's stream."""

from __future__ import annotations

import contextlib

from tracea.dtypes import DType

from tracea_cuda import launcher


class _Buf:
    def __init__(self, addr: int, size: int, dtype: DType) -> None:
        self.addr, self.size, self.dtype = addr, size, dtype


class _Adapter:
    def __init__(self) -> None:
        self.made: list[_Buf] = []

    def data_ptr(self, obj):
        return obj.addr if isinstance(obj, _Buf) else id(obj)

    def empty_factory(self, shape, dtype, like):
        def new(obj):
            buf = _Buf(0x1000_0000 * (len(self.made) + 1), shape[0], dtype)
            self.made.append(buf)
            return buf
        return new


def test_prepasses_share_one_buffer_and_run_in_order(monkeypatch):
    monkeypatch.setattr(launcher, "is_capturing", lambda s: True)  # the per-call path (capture)
    monkeypatch.setattr(launcher, "on_device", lambda dev: contextlib.nullcontext)
    log = []
    adapter = _Adapter()

    def prepass(stream, ptrs):
        log.append(("pre", stream, ptrs))

    def inner_ptrs(p0, p1, bias, out):
        log.append(("inner", p0, p1, bias, out))

    inner = lambda *a: None  # noqa: E731 - the array form is not used
    inner.by_pointer = inner_ptrs
    launch = launcher.with_prepasses(adapter, 0, lambda: 77, (13, 30), DType.F32, prepass, inner)
    assert launch.pointer_only
    x0, x1, bias, out = object(), object(), object(), object()
    for call in range(2):  # a fresh buffer per call
        log.clear()
        launch(x0, x1, bias, out)
        (n0, s0, p), (n1, t0, t1, b, o) = log
        buf = adapter.made[call]
        assert (n0, n1, s0) == ("pre", "inner", 77) and (b, o) == (bias, out)
        assert p == (id(x0), buf.addr, id(x1), buf.addr + 256) and (t0, t1) == (buf.addr, buf.addr + 256)
        assert buf.size == 64 + 30 and buf.dtype is DType.F32  # 13 floats rounded up to 256 bytes, then 30
    assert len(adapter.made) == 2


def test_pair_launch_lays_out_both_jobs(monkeypatch):
    calls = []

    class _Driver:
        @staticmethod
        def launchKernel(*args):  # noqa: N802 - CuPy's name
            calls.append(args)

    class _Cupy:
        class cuda:  # noqa: N801
            driver = _Driver

    monkeypatch.setattr(launcher.toolkit, "cupy", lambda: _Cupy)

    class _Fn:
        ptr = 1234

    fl = launcher.pair_launch(_Fn, ((3, 2, 5), (7, 9)), ((4, 1, 2), (11, 13)))
    assert fl.grid == (3 * 2 * 5 + 4 * 1 * 2, 1, 1) and fl.block == 256
    fl(55, (0xA0, 0xB0, 0xC0, 0xD0))
    values = [h.value for h in fl.params.holders]
    assert values == [0xA0, 0xB0, 7, 9, 3, 2, 0xC0, 0xD0, 11, 13, 4, 1, 30]
    assert calls and calls[0][0] == 1234 and calls[0][8] == 55


def _kept_setup(monkeypatch, capturing):
    monkeypatch.setattr(launcher, "on_device", lambda dev: contextlib.nullcontext)
    monkeypatch.setattr(launcher, "is_capturing", lambda s: capturing)
    monkeypatch.setattr(launcher, "_prepass_buffers", {})
    made = []

    def scratch(adapter, like, n, zeroed=False):
        buf = _Buf(0x1000_0000 * (len(made) + 1), n, DType.F32)
        made.append(buf)
        return buf

    monkeypatch.setattr(launcher, "scratch", scratch)
    return made


def _bound(adapter, stream, sizes, log):
    inner = lambda *a: None  # noqa: E731
    inner.by_pointer = lambda p0, p1, bias, out: log.append(("inner", p0, p1))
    return launcher.with_prepasses(adapter, 0, stream, sizes, DType.F32,
                                   lambda s, ptrs: log.append(("pre", s, ptrs[1], ptrs[3])), inner)


def test_prepasses_keep_one_buffer_per_stream_outside_capture(monkeypatch):
    made = _kept_setup(monkeypatch, capturing=False)
    adapter, log, current = _Adapter(), [], [77]
    small = _bound(adapter, lambda: current[0], (13, 30), log)
    big = _bound(adapter, lambda: current[0], (100, 200), log)
    x0, x1 = object(), object()
    for _ in range(3):
        small(x0, x1, None, None)
    assert len(made) == 1 and made[0].size * 4 >= (64 + 30) * 4 and not adapter.made  # kept, reused
    a = made[0].addr
    assert log[-2:] == [("pre", 77, a, a + 256), ("inner", a, a + 256)]
    big(x0, x1, None, None)  # grows the stream's buffer
    assert len(made) == 2 and made[1].size >= 128 + 200
    small(x0, x1, None, None)  # a smaller launch reuses the grown buffer
    assert len(made) == 2 and log[-1] == ("inner", made[1].addr, made[1].addr + 256)
    current[0] = 78  # another stream: its own buffer
    small(x0, x1, None, None)
    assert len(made) == 3 and set(launcher._prepass_buffers) == {(0, 77), (0, 78)}
    launcher.release_scratch()
    assert not launcher._prepass_buffers


def test_prepasses_allocate_per_call_inside_capture_and_above_the_cap(monkeypatch):
    made = _kept_setup(monkeypatch, capturing=True)
    adapter, log = _Adapter(), []
    launch = _bound(adapter, lambda: 5, (13, 30), log)
    launch(object(), object(), None, None)
    launch(object(), object(), None, None)
    assert not made and len(adapter.made) == 2  # the graph's allocator, per call
    monkeypatch.setattr(launcher, "is_capturing", lambda s: False)
    monkeypatch.setattr(launcher, "prepass_keep_bytes", lambda dev: 64)
    huge = _bound(adapter, lambda: 5, (13, 30), log)
    huge(object(), object(), None, None)
    assert not made and len(adapter.made) == 3
