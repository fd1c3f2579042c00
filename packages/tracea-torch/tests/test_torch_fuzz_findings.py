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


# ---- the PyTorch fallback (tracea_torch.eager) ------------------------------------------------------

def test_fallback_honours_a_wider_out_dtype():
    # float16 inputs, float32 output: the fallback computed in float16 and rounded (rel. error ~5e-4).
    a, b = torch.randn(33, 64, dtype=torch.float16), torch.randn(64, 17, dtype=torch.float16)
    got = ops.matmul(a, b, out_dtype="float32", activation="silu")
    want = torch.nn.functional.silu(a.double() @ b.double())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    x, w = torch.randn(1, 4, 9, 9, dtype=torch.bfloat16), torch.randn(3, 4, 3, 3, dtype=torch.bfloat16)
    got = ops.conv2d(x, w, out_dtype="float32")
    want = torch.nn.functional.conv2d(x.double(), w.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_fallback_conv_with_bias_and_another_out_dtype():
    # The bias (converted to the output dtype) met float32 inputs in F.conv2d: a BackendError.
    x, w, b = torch.randn(1, 6, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    got = ops.conv2d(x, w, b, groups=2, activation="relu", out_dtype="bfloat16")
    want = torch.relu(torch.nn.functional.conv2d(x, w, b.bfloat16().float(), groups=2))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_fallback_grouped_query_attention_on_3d_inputs():
    # (heads, seq, d) with fewer kv heads: the kv heads were repeated along seq (a BackendError).
    q = torch.randn(4, 7, 16, dtype=torch.float16)
    k, v = torch.randn(2, 5, 16, dtype=torch.float16), torch.randn(2, 5, 16, dtype=torch.float16)
    got = ops.attention(q, k, v, causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 0), v.double().repeat_interleave(2, 0), is_causal=True)
    assert got.shape == (4, 7, 16)
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-3)


def test_fallback_gelu_of_inf_is_inf():
    from tracea.ir.epilogue import Epilogue
    from tracea_torch import eager

    x = torch.tensor([float("inf"), -1.0, float("nan")])
    y = eager.apply_epilogue(x, Epilogue.of("gelu_erf"), None, 0)
    assert y[0] == float("inf") and torch.isnan(y[2])
    torch.testing.assert_close(y[1], torch.nn.functional.gelu(torch.tensor(-1.0)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_fallback_attention_with_overlapping_query_rows(dtype):
    # PyTorch's CPU SDPA gets rows that share memory wrong (errors of ~3, or NaN); the fallback packs them.
    base = torch.randn(2 * 4 * 1056 + 64, dtype=dtype)
    q = torch.as_strided(base, (2, 4, 32, 33), (4224, 1056, 1, 1))
    k, v = torch.randn(2, 4, 5, 33, dtype=dtype), torch.randn(2, 4, 1, 33, dtype=dtype).expand(2, 4, 5, 33)
    got = ops.attention(q, k, v, scale=1.0)
    want = torch.nn.functional.scaled_dot_product_attention(q.double().contiguous(), k.double(), v.double().contiguous(),
                                                            scale=1.0)
    torch.testing.assert_close(got.double(), want, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_conv_fallback_avoids_onednn_wrong_shapes(dtype, channels_last):
    """Fuzz case 5151:5767: PyTorch's CPU conv (oneDNN, torch 2.13 on an AMX Xeon) returned errors ~20 for a
    1-channel 7x7 input, 5x5 kernel, stride (1, 3) in bfloat16, and in float32 once the input is
    channels_last (a 1-channel tensor whose contiguous() keeps the NHWC strides). The fallback computes in
    float32 on row-major copies and keeps the caller's memory format."""
    from tracea.ir.ops import Conv2dOp
    from tracea_torch import eager

    g = torch.Generator().manual_seed(5767)
    x = torch.randn(1, 1, 7, 7, generator=g).to(dtype)
    w = torch.randn(16, 1, 5, 5, generator=g).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    ref = torch.nn.functional.conv2d(x.double().contiguous(), w.double(), stride=(1, 3), padding=(2, 0))
    op = Conv2dOp(1, 1, 7, 7, 16, 5, 5, stride=(1, 3), padding=(2, 0), dtype=str(dtype).split(".")[1])
    got = eager.run_logical(op, {"x": x, "w": w, "bias": None})
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (got.double() - ref).abs().max().item() <= tol * ref.abs().max().item()
    y = ops.conv2d(x, w, stride=(1, 3), padding=(2, 0))
    assert (y.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale,causal", [(-1.0, True), (0.0, True), (-1.0, False)])
def test_cuda_fallback_attention_with_a_non_positive_scale(dtype, scale, causal):
    """Fuzz cases 4401:2194 / 3150 / 6063: PyTorch's fused CUDA SDPA kernels return NaN for a zero or negative
    scale in 16-bit; head dims no Tracea kernel takes (33, 63, 7) went there through the fallback."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = torch.Generator(device="cuda").manual_seed(2194)
    for seq_q, seq_kv, d in ((16, 16, 33), (3, 3, 63), (11, 3, 7)):
        q, k, v = (torch.randn(2, 3, s, d, device="cuda", generator=g).to(dtype) for s in (seq_q, seq_kv, seq_kv))
        got = ops.attention(q, k, v, causal=causal, scale=scale)
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                is_causal=causal, scale=scale)
        assert not got.isnan().any()
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
