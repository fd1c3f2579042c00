"""Regressions for defects the ops fuzzer (tracea.fuzzing) found on torch tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tracea import ops  # noqa: E402
from tracea.errors import DTypeError, InvalidArgumentError  # noqa: E402
from tracea_torch.adapter import TorchAdapter  # noqa: E402


def test_out_overlapping_an_input_is_refused():
    # out in the same storage as b, partly over it: the kernel wrote out while reading b (wrong results).
    buf = torch.randn(200)
    a = torch.randn(4, 6)
    b = buf[:60].view(6, 10)
    out = buf[30:70].view(4, 10)
    before = buf.clone()
    with pytest.raises(InvalidArgumentError, match="'out'.*does not overlap input 'b'"):
        ops.matmul(a, b, out=out)
    assert torch.equal(buf, before)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(InvalidArgumentError, match="'out'.*does not overlap input 'q'"):
        ops.attention(q, torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), out=q)


def test_out_next_to_an_input_in_one_storage_is_accepted():
    buf = torch.randn(100)
    a, b = torch.randn(4, 6), buf[:60].view(6, 10)
    out = buf[60:100].view(4, 10)
    got = ops.matmul(a, b, out=out)
    assert got is out
    torch.testing.assert_close(out, a @ buf[:60].view(6, 10))


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_non_float_out_is_refused(dtype):
    out = torch.zeros(4, 10, dtype=dtype)
    with pytest.raises(DTypeError, match="'out.dtype'"):
        ops.matmul(torch.randn(4, 6), torch.randn(6, 10), out=out)
    assert not out.any()


def test_memory_span():
    t = torch.zeros(10, 10)
    span = TorchAdapter().memory_span(t[2:4, 1::3])
    assert span == (t.data_ptr() + 21 * 4, t.data_ptr() + 38 * 4)
    assert TorchAdapter().memory_span(torch.zeros(0, 3)) is None
    e = torch.zeros(3, 1)
    assert TorchAdapter().memory_span(e.expand(3, 4)) == (e.data_ptr(), e.data_ptr() + 3 * 4)
