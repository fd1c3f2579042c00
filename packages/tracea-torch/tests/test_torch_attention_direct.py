"""``tracea.ops.attention`` on signatures no Tracea kernel serves: after the first call the plan calls PyTorch's
SDPA directly (``tracea_torch.eager.direct_attention``) instead of the fallback hook, with the hook's results.
float64 has no kernel on any backend, so it stands in for every declined signature (e.g. 16-bit on AMX CPUs)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import tracea  # noqa: E402
from tracea.runtime import fallbacks  # noqa: E402
from tracea_torch import eager  # noqa: E402


@pytest.fixture
def hook_calls(monkeypatch):
    """How many calls went through :func:`tracea_torch.eager.attention` (the hook's path)."""
    calls = [0]
    real = eager.attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(eager, "attention", counted)
    return calls


def _rand(*shape, dtype=torch.float64, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("heads,kv_heads,mask", [(4, 4, None), (4, 2, None), (3, 3, "bool"), (2, 1, "additive")])
def test_declined_signature_calls_sdpa_directly(hook_calls, heads, kv_heads, mask, device):
    q, k, v = (_rand(2, h, s, 16, device=device) for h, s in ((heads, 7), (kv_heads, 9), (kv_heads, 9)))
    m = None
    if mask == "bool":
        m = torch.rand(2, 1, 7, 9, device=device) > 0.3
        m[..., 0] = True
    elif mask == "additive":
        m = _rand(1, heads, 7, 9, device=device)
    gqa = heads != kv_heads
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)
    def counted() -> int:
        return sum(n for (kind, _), n in fallbacks.counts().items() if kind == "attention")

    before = counted()
    first = tracea.ops.attention(q, k, v, m, enable_gqa=gqa)
    assert hook_calls[0] == 1  # the runner's first call went through the hook
    for _ in range(3):
        assert torch.equal(tracea.ops.attention(q, k, v, m, enable_gqa=gqa), ref)
    assert hook_calls[0] == 1 and torch.equal(first, ref)
    assert counted() - before == 4  # every call counted


def test_direct_path_keeps_no_autograd_graph(hook_calls):
    q = _rand(1, 2, 5, 8).requires_grad_()
    k, v = _rand(1, 2, 5, 8), _rand(1, 2, 5, 8)
    tracea.ops.attention(q, k, v)
    out = tracea.ops.attention(q, k, v)
    assert hook_calls[0] == 1 and not out.requires_grad and out.grad_fn is None


def test_misaligned_call_of_a_direct_signature_takes_the_hook_path(hook_calls):
    """The signature fixes shapes and strides, not where a view starts: a view 8 bytes into a buffer (PyTorch's
    CUDA kernels need 16-byte aligned rows) goes through :func:`eager.attention`, which packs it."""
    buf = _rand(2 * 3 * 6 * 8 + 1)
    q, k, v = _rand(2, 3, 6, 8), _rand(2, 3, 6, 8), _rand(2, 3, 6, 8)
    tracea.ops.attention(q, k, v)
    shifted = buf[1:].view(2, 3, 6, 8)
    assert shifted.data_ptr() % 16
    out = tracea.ops.attention(shifted, k, v)
    assert hook_calls[0] == 2
    torch.testing.assert_close(out, F.scaled_dot_product_attention(shifted, k, v))


@pytest.mark.parametrize("layout", ["qkv_unbound", "heads_transposed", "decode_query"])
def test_strided_views_models_pass_go_direct_on_the_cpu(hook_calls, layout):
    """The views attention layers hand to SDPA (timm: q, k, v unbound from one (B, S, 3, H, D) projection; Hugging
    Face: heads transposed out of (B, S, H, D); a one-token query) take the direct path on CPU tensors."""
    if layout == "qkv_unbound":
        q, k, v = (t.transpose(1, 2) for t in _rand(2, 9, 3, 4, 16).unbind(2))
    elif layout == "heads_transposed":
        q, k, v = (_rand(2, 9, 4, 16).transpose(1, 2) for _ in range(3))
    else:
        q, k, v = _rand(3, 1, 4, 16).transpose(1, 2), _rand(3, 4, 5, 16), _rand(3, 4, 5, 16)
    assert not q.is_contiguous() or layout == "decode_query"
    ref = F.scaled_dot_product_attention(q, k, v)
    outs = [tracea.ops.attention(q, k, v) for _ in range(3)]
    assert hook_calls[0] == 1
    for out in outs:
        assert torch.equal(out, ref)


@pytest.mark.parametrize("case", ["overlapping", "mask_dtype", "causal_mask", "expanded_gqa"])
def test_signatures_the_direct_path_leaves_to_the_hook(hook_calls, case):
    q, k, v = _rand(2, 4, 6, 8), _rand(2, 4, 6, 8), _rand(2, 4, 6, 8)
    kwargs: dict = {}
    if case == "overlapping":  # rows sharing memory: PyTorch's CPU SDPA misreads them, the hook packs them
        q = torch.as_strided(_rand(2 * 4 * 6 * 8), (2, 4, 6, 8), (4 * 6 * 8, 6 * 8, 4, 1))
    elif case == "mask_dtype":  # a float32 additive mask on float64 operands: converted by the hook
        kwargs["attn_mask"] = torch.randn(2, 4, 6, 6)
    elif case == "causal_mask":  # both apply (PyTorch takes one or the other): the hook merges them
        kwargs["attn_mask"], kwargs["is_causal"] = torch.rand(6, 6) > 0.2, True
    else:  # broadcast leading dims with GQA: K and V expanded by the hook
        q, k, v = _rand(2, 4, 6, 8), _rand(1, 2, 6, 8), _rand(1, 2, 6, 8)
    outs = [tracea.ops.attention(q, k, v, **kwargs) for _ in range(2)]
    assert hook_calls[0] == 2
    mask = kwargs.get("attn_mask")
    if case == "causal_mask":
        mask = mask & torch.ones(6, 6, dtype=torch.bool).tril()
    elif case == "mask_dtype":
        mask = mask.to(q.dtype)
    elif case == "expanded_gqa":
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    ref = F.scaled_dot_product_attention(q.contiguous(), k, v, attn_mask=mask)  # (packed: see "overlapping")
    for out in outs:
        torch.testing.assert_close(out, ref)
