"""``launcher.with_prepasses`` on the CPU with stand-ins (no GPU): each operand's pre-pass reads that operand
and writes its own scratch buffer (of the pass's size and dtype, from the adapter's allocator), the inner
launcher gets the two buffers with bias and out, everything on the stream the getter returns, in order."""

from __future__ import annotations

import contextlib

from tracea.dtypes import DType

from tracea_cuda import launcher


class _Buf:
    def __init__(self, tag: str, size: int, dtype: DType) -> None:
        self.tag, self.size, self.dtype = tag, size, dtype


class _Adapter:
    def __init__(self) -> None:
        self.made = 0

    def data_ptr(self, obj):
        return id(obj)

    def empty_factory(self, shape, dtype, like):
        def new(obj):
            self.made += 1
            return _Buf(f"scratch{self.made}", shape[0], dtype)
        return new


def test_prepasses_run_in_order_on_the_stream(monkeypatch):
    monkeypatch.setattr(launcher, "on_device", lambda dev: contextlib.nullcontext)
    log = []
    adapter = _Adapter()

    def kernel(name):
        return lambda stream, ptrs: log.append((name, stream, ptrs))

    def inner(t0, t1, bias, out):
        log.append(("inner", t0, t1, bias, out))

    passes = [(12, DType.F32, kernel("split0")), (30, DType.BF16, kernel("split1"))]
    launch = launcher.with_prepasses(adapter, 0, lambda: 77, passes, inner)
    assert launch.pointer_only
    x0, x1, bias, out = object(), object(), object(), object()
    for _call in range(2):  # a fresh pair of buffers per call
        log.clear()
        launch(x0, x1, bias, out)
        (n0, s0, p0), (n1, s1, p1), (n2, t0, t1, b, o) = log
        assert (n0, n1, n2, s0, s1) == ("split0", "split1", "inner", 77, 77)
        assert p0 == (id(x0), id(t0)) and p1 == (id(x1), id(t1)) and (b, o) == (bias, out)
        assert (t0.size, t0.dtype, t1.size, t1.dtype) == (12, DType.F32, 30, DType.BF16)
    assert adapter.made == 4
