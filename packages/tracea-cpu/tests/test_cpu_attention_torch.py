"""The CPU attention kernel through the user call, ``tracea.ops.attention`` on torch CPU tensors, against
PyTorch's SDPA in float64: the layouts models hand to SDPA (timm's packed qkv buffer, Hugging Face's
(batch, seq, heads, dim) views, KV caches that are windows of a longer buffer), read in place (the kernel
takes strides: no packing launcher), GQA decode, top-left causal with seq_q != seq_kv, boolean and additive
masks broadcast over batch / heads, a value head dim of its own, 3-D inputs."""

from __future__ import annotations

import pytest

from tracea_cpu.testing import BEST, HAVE_CC

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not HAVE_CC, reason="no C compiler")]

import torch.nn.functional as F  # noqa: E402

import tracea  # noqa: E402
from tracea.runtime.plans import lookup, signature  # noqa: E402


def _ref(q, k, v, mask=None, causal=False, gqa=False):
    m = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, is_causal=causal,
                                          enable_gqa=gqa)


def _check(q, k, v, mask=None, causal=False, gqa=False, tol=1e-5):
    out = tracea.ops.attention(q, k, v, mask, is_causal=causal, enable_gqa=gqa)
    ref = _ref(q, k, v, mask, causal, gqa)
    assert out.shape == ref.shape and out.dtype == q.dtype
    err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
    assert err < tol, err
    return out


def _runner(q, k, v, mask=None, causal=False, gqa=False):
    key = ("attention", signature(q), signature(k), signature(v), signature(mask), signature(None), 0.0, causal, None,
           gqa, None, None)
    return lookup(key).runner


def test_timm_packed_qkv_read_in_place():
    """timm's ViT: one (B, N, 3, H, D) buffer, q / k / v are strided views; the CPU kernel takes them as
    they are and writes an output in q's (B, N, H, D) storage order."""
    torch.manual_seed(0)
    for b, n, h, d in [(2, 197, 3, 64), (1, 50, 12, 64), (3, 49, 4, 32), (1, 7, 2, 40)]:
        x = torch.randn(b, n, 3, h, d)
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        out = _check(q, k, v)
        run = _runner(q, k, v)
        assert run.decision.chosen.variant.name == f"cpu.attention.{BEST}"
        assert run.decision.chosen.variant.takes_strides(run.decision.op)
        assert run.decision.op.strides is not None
        assert out.transpose(1, 2).is_contiguous()  # (B, N, H, D) memory: the model's reshape is a view


def test_hf_decode_gqa_with_cache_windows():
    """A Hugging Face style decode step: q (B, 1, H, D) viewed as (B, H, 1, D), k / v the first `t` positions of
    a longer (B, KVH, T, D) cache (strided windows), GQA groups of 4 and 2; a few new tokens too."""
    torch.manual_seed(1)
    for b, h, kvh, sq, t, d in [(1, 32, 8, 1, 77, 128), (2, 8, 2, 1, 300, 64), (1, 8, 2, 4, 129, 64),
                                (3, 6, 6, 1, 1, 16), (1, 4, 1, 8, 33, 80)]:
        q = torch.randn(b, sq, h, d).transpose(1, 2)
        cache_k, cache_v = torch.randn(b, kvh, t + 40, d), torch.randn(b, kvh, t + 40, d)
        k, v = cache_k[:, :, :t], cache_v[:, :, :t]
        _check(q, k, v, gqa=h != kvh)
        if sq > 1:
            _check(q, k, v, causal=True, gqa=h != kvh)  # top-left: query i sees keys 0..i only


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks_broadcast(kind):
    torch.manual_seed(2)
    b, h, sq, skv, d = 3, 4, 33, 70, 24
    q, k, v = torch.randn(b, h, sq, d), torch.randn(b, h, skv, d), torch.randn(b, h, skv, d)
    for shape in [(b, 1, 1, skv), (1, h, sq, skv), (b, 1, sq, skv), (sq, skv)]:
        if kind == "bool":
            mask = torch.rand(shape) < 0.8
            mask[..., 0] = True  # no fully masked row: PyTorch's math path gives NaN there, the kernel 0
        else:
            mask = torch.randn(shape) * 2
        _check(q, k, v, mask)


def test_swin_shifted_window_mask_per_head():
    """timm's Swin: the (nW, N, N) shift mask expanded over the images and heads, (B * nW, H, N, N)."""
    torch.manual_seed(3)
    nw, imgs, h, n, d = 4, 2, 3, 49, 32
    region = torch.randint(0, 4, (nw, n))
    shift = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    mask = shift.view(1, nw, 1, n, n).expand(imgs, -1, h, -1, -1).reshape(-1, h, n, n)
    x = torch.randn(imgs * nw, n, 3, h, d)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
    _check(q, k, v, mask)


def test_value_head_dim_and_3d_inputs():
    torch.manual_seed(4)
    q, k, v = torch.randn(5, 17, 40), torch.randn(5, 23, 40), torch.randn(5, 23, 24)
    _check(q, k, v)
    _check(q, k, v, causal=True)


def test_nonfinite_rows_as_pytorch():
    """A NaN in one key's k poisons every row that sees it (non-causal: all rows of that head)."""
    torch.manual_seed(5)
    q, k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    k[0, 1, 5, 3] = float("nan")
    out = tracea.ops.attention(q, k, v)
    assert torch.isnan(out[0, 1]).all() and not torch.isnan(out[0, 0]).any()
