"""The torch array adapter and the plugin hooks: tracea.ops on torch tensors, zero-copy host views,
the PyTorch fallback hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tracea
from tracea.dtypes import DType
from tracea.errors import DTypeError, UnsupportedDeviceError
from tracea.ir.device import Device
from tracea_torch import fallbacks, plugin
from tracea_torch.adapter import TorchAdapter

pytestmark = pytest.mark.torch


def test_owns_tensors_and_parameters_only():
    ad = TorchAdapter()
    assert ad.owns(torch.zeros(2)) and ad.owns(torch.nn.Parameter(torch.zeros(2)))
    assert not ad.owns(np.zeros(2)) and not ad.owns([1.0])
    assert ad.logical_nchw and ad.priority > 10


def test_info_shape_strides_dtype_device():
    ad = TorchAdapter()
    t = torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)
    info = ad.info(t)
    assert info.shape == (2, 3, 4, 5) and info.strides == (60, 1, 15, 3)
    assert info.dtype is DType.F32 and info.device == Device.cpu() and info.adapter == "torch"
    assert not info.c_contiguous
    assert ad.info(torch.zeros(3, dtype=torch.bfloat16)).dtype is DType.BF16
    with pytest.raises(DTypeError):
        ad.info(torch.zeros(3, dtype=torch.complex64))


def test_host_views_are_zero_copy_and_write_through():
    ad = TorchAdapter()
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = ad.to_numpy(t)
    view[1, 2] = 42.0
    assert t[1, 2].item() == 42.0
    host = ad.to_host(t)
    host[0, 0] = -1.0
    assert t[0, 0].item() == 0.0


def test_bfloat16_host_view_needs_ml_dtypes():
    ad = TorchAdapter()
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    if DType.BF16.numpy is None:
        with pytest.raises(DTypeError, match="ml_dtypes"):
            ad.to_numpy(t)
    else:
        np.testing.assert_array_equal(ad.to_numpy(t).astype(np.float32), [1.5, -2.0])


def test_host_bits_read_bf16_without_ml_dtypes_zero_copy():
    ad = TorchAdapter()
    t = torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16)
    bits = ad.host_bits(t)
    assert bits.dtype == np.uint16 and bits.shape == (2, 2)
    # bf16 is the top half of float32
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), [[1.5, -2.0], [0.25, 3.0]])
    bits[0, 0] = 0x4000  # 2.0: writes through
    assert t[0, 0].item() == 2.0
    assert ad.host_bits(torch.zeros(3)).dtype == np.uint32
    with pytest.raises(DTypeError):
        ad.host_bits(torch.zeros(2, dtype=torch.complex64))


def test_empty_from_numpy_and_views():
    ad = TorchAdapter()
    like = torch.zeros(1, dtype=torch.float16)
    e = ad.empty((3, 4), DType.F32, like)
    assert e.shape == (3, 4) and e.dtype == torch.float32 and e.device == like.device
    src = np.random.rand(2, 3).astype(np.float32)
    t = ad.from_numpy(src, Device.cpu())
    src[0, 0] = 7.0
    assert t[0, 0].item() != 7.0  # a copy
    assert ad.swap_last(t).shape == (3, 2) and ad.permute(t, (1, 0)).shape == (3, 2)
    assert ad.astype(t, DType.F64).dtype == torch.float64
    with pytest.raises(UnsupportedDeviceError):
        ad.from_numpy(src, Device("opencl", 0))
    assert ad.cuda_stream(t) == 0


def test_conv_fp32_precision_follows_cudnn_on_cuda():
    import types

    ad = TorchAdapter()
    cudnn = torch.backends.cudnn
    old_matmul = torch.get_float32_matmul_precision()
    cuda_like = types.SimpleNamespace(is_cuda=True)
    try:
        torch.set_float32_matmul_precision("highest")
        with cudnn.flags(enabled=cudnn.enabled, allow_tf32=True):
            assert ad.conv_fp32_precision(cuda_like) == "high"
            assert ad.conv_fp32_precision(torch.ones(1)) == "highest"  # CPU convs: the matmul precision
            on = ad.framework_state()
        with cudnn.flags(enabled=cudnn.enabled, allow_tf32=False):
            assert ad.conv_fp32_precision(cuda_like) == "highest"
            assert ad.framework_state() != on  # a cached plan's key changes with the flag
    finally:
        torch.set_float32_matmul_precision(old_matmul)


def test_fp32_precision_follows_torch():
    ad = TorchAdapter()
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert ad.fp32_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(old)


def test_tracea_ops_accept_torch_tensors_through_dispatch(reference_backend):
    a, b, bias = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
    out = tracea.ops.matmul(a, b.t().contiguous().t(), bias=bias, activation="relu")
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, torch.relu(a @ b + bias), rtol=1e-5, atol=1e-5)
    x, w = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3)
    y = tracea.ops.conv2d(x.to(memory_format=torch.channels_last), w, None, padding=1)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)
    assert fallbacks.total() == 0


def test_core_dispatch_falls_back_to_pytorch_through_the_hook(reference_backend, monkeypatch):
    every = [v.name for v in tracea.get_doctor().variants() if v.op_kind.value in ("conv2d", "gemm")]
    monkeypatch.setenv("TRACEA_EXCLUDE_VARIANTS", ",".join(every))  # nothing serves: core must fall back
    tracea.get_doctor().invalidate()
    try:
        x, w, b = torch.randn(2, 4, 7, 7), torch.randn(6, 2, 3, 3), torch.randn(6)
        # core's "gelu" is the tanh form (tracea_torch's follows torch: erf)
        y = tracea.ops.conv2d(x.to(memory_format=torch.channels_last), w, b, stride=2, groups=2, activation="gelu")
        ref = F.gelu(F.conv2d(x, w, b, stride=2, groups=2), approximate="tanh")
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        a, m = torch.randn(3, 4, 5), torch.randn(5, 2)
        out = torch.empty(3, 4, 2)
        r = tracea.ops.matmul(a, m, out=out, activation="silu")
        assert r is out
        torch.testing.assert_close(out, F.silu(a @ m), rtol=1e-5, atol=1e-5)
        assert fallbacks.total("conv2d", "excluded by TRACEA_EXCLUDE_VARIANTS") == 1
        assert fallbacks.total("gemm", "excluded") == 1
    finally:
        monkeypatch.delenv("TRACEA_EXCLUDE_VARIANTS")
        tracea.get_doctor().invalidate()


def test_fallback_hook_ignores_other_array_kinds():
    op = tracea.GemmOp(2, 2, 2)
    assert plugin.tracea_fallback_run(op=op, arrays={"a": np.zeros((2, 2)), "b": np.zeros((2, 2))}, out=None,
                                      reason="x") is None


def test_backend_info_reports_torch():
    info = plugin.tracea_backend_info()
    assert info.name == "torch" and info.available and info.details["torch"] == torch.__version__


def test_attention_on_tensors_and_its_sdpa_fallback(reference_backend, monkeypatch):
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)  # grouped-query: 2 kv heads for 4 heads
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    out = tracea.ops.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    every = [v_.name for v_ in tracea.get_doctor().variants() if v_.op_kind.value == "attention"]
    monkeypatch.setenv("TRACEA_EXCLUDE_VARIANTS", ",".join(every))
    tracea.get_doctor().invalidate()
    try:
        out = tracea.ops.attention(q, k, v, causal=True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert fallbacks.total("attention") == 1
    finally:
        monkeypatch.delenv("TRACEA_EXCLUDE_VARIANTS")
        tracea.get_doctor().invalidate()


def test_output_factories_allocate_what_torch_empty_would():
    """``empty_factory`` / ``channels_last_factory`` take ``torch.empty_like`` (same shape, dtype and packed strides
    as the call's tensor) or ``Tensor.new_empty`` instead of ``torch.empty(shape, dtype=, device=)``: the result
    has ``torch.empty``'s strides, dtype and device, is a plain tensor that does not require grad, and no input's
    memory (a transposed view, a strided or zero-size tensor, another dtype, a Parameter) changes that."""
    from tracea.dtypes import DType

    from tracea_torch.adapter import TorchAdapter

    ad = TorchAdapter()
    cases = [
        (torch.randn(2, 8, 5, 5), (2, 8, 5, 5), DType.F32),  # same shape: empty_like
        (torch.randn(2, 8, 5, 5), (2, 16, 3, 3), DType.F32),  # new_empty
        (torch.randn(6, 4).t(), (4, 6), DType.F32),  # transposed view of the output's shape: not empty_like
        (torch.randn(4, 6)[:, ::2], (4, 3), DType.F32),  # strided view
        (torch.randn(3, 5), (3, 5), DType.BF16),  # another dtype
        (torch.nn.Parameter(torch.randn(7, 7)), (7, 7), DType.F32),  # a Parameter that requires grad
        (torch.randn(0, 3), (0, 3), DType.F32),
        (torch.randn(1, 1, 1, 1), (1, 1, 1, 1), DType.F16),
        (torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last), (2, 8, 5, 5), DType.F32),  # packed out
    ]
    for like, shape, dtype in cases:
        make = ad.empty_factory(shape, dtype, like)
        for obj in (like, like.detach().clone() if like.is_contiguous() else like):
            got = make(obj)
            want = torch.empty(shape, dtype=got.dtype, device=like.device)
            assert type(got) is torch.Tensor and not got.requires_grad, (shape, dtype)
            assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype, (shape, dtype)
            assert got.device == like.device and got.data_ptr() != obj.data_ptr() or got.numel() == 0
    cl = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    for like, shape in ((cl, (2, 8, 5, 5)), (cl, (2, 4, 3, 3)), (torch.randn(2, 8, 5, 5), (2, 8, 5, 5)),
                        (torch.randn(1, 8, 1, 1).contiguous(memory_format=torch.channels_last), (1, 8, 1, 1))):
        got = ad.channels_last_factory(shape, DType.F32, like)(like)
        want = torch.empty(shape, memory_format=torch.channels_last)
        assert got.shape == want.shape and got.stride() == want.stride(), (like.stride(), shape)
