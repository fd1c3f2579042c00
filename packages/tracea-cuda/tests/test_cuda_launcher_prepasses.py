"""``launcher.with_prepasses`` and ``launcher.pair_launch`` on the CPU with stand-ins (no GPU): one scratch
buffer per call (both regions, the second aligned), one pre-pass launch reading both operands and writing
the two regions, then the inner launcher's pointer form on the regions, all on the getter's stream."""

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
