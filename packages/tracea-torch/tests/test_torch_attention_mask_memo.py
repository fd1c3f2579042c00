"""A boolean (or seq_q-broadcast) ``attn_mask`` is converted to the kernels' packed operand once per
version of the same mask tensor: reused across calls (and layers), converted again after an in-place
write, for a new tensor, for inference tensors (no version counter), and never reused under a CUDA graph
capture. Results always follow the mask's current contents (float64 reference)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

import tracea  # noqa: E402
from tracea_torch.adapter import TorchAdapter  # noqa: E402


@pytest.fixture
def conversions(monkeypatch):
    """Counts the mask conversions (the plan's copies into a fresh packed array)."""
    count = {"n": 0}
    real = TorchAdapter.copy_

    def copy_(self, dst, src):  # noqa: ANN001, ANN202
        if src.dtype == torch.bool or src.shape != dst.shape:
            count["n"] += 1
        return real(self, dst, src)

    monkeypatch.setattr(TorchAdapter, "copy_", copy_)
    return count


def ref(q, k, v, mask):  # noqa: ANN001, ANN201
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.softmax(s, -1) @ v.double()


def close(got, want) -> bool:  # noqa: ANN001
    return float((got.double() - want).abs().max()) < 1e-4


def inputs(b: int, h: int, sq: int, skv: int, seed: int):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, 64, generator=g)
    k, v = (torch.randn(b, h, skv, 64, generator=g) for _ in range(2))
    return q, k, v, g


def test_bool_mask_converted_once_per_version(conversions):
    q, k, v, g = inputs(2, 3, 11, 13, 0)  # a signature of its own: a fresh plan
    mask = torch.rand(2, 1, 11, 13, generator=g) < 0.6
    mask[..., 0] = True
    for _ in range(3):
        assert close(tracea.ops.attention(q, k, v, mask), ref(q, k, v, mask))
    assert conversions["n"] == 1  # the first call converted it, the others reused it
    mask[..., 5:9] = ~mask[..., 5:9]  # in place: version bumped, converted again
    assert close(tracea.ops.attention(q, k, v, mask), ref(q, k, v, mask))
    assert conversions["n"] == 2
    view = mask[:, :, :, :]  # a write through a view bumps the shared counter too
    view[1, 0, 3] = False
    view[1, 0, 3, 0] = True
    assert close(tracea.ops.attention(q, k, v, mask), ref(q, k, v, mask))
    assert conversions["n"] == 3
    other = mask.clone()  # equal contents, another tensor: converted
    assert close(tracea.ops.attention(q, k, v, other), ref(q, k, v, other))
    assert conversions["n"] == 4


def test_broadcast_additive_mask_memo_and_release(conversions):
    q, k, v, g = inputs(2, 2, 9, 17, 1)
    pad = torch.zeros(2, 1, 1, 17)
    pad[1, ..., :5] = float("-inf")  # an HF-style padding mask, broadcast over seq_q: expanded per version
    want = ref(q, k, v, pad.expand(2, 1, 9, 17))
    for _ in range(2):
        assert close(tracea.ops.attention(q, k, v, pad), want)
    assert conversions["n"] == 1
    pad.add_(0.0)  # any in-place op counts as a write
    assert close(tracea.ops.attention(q, k, v, pad), want)
    assert conversions["n"] == 2
    del pad
    gc.collect()  # the memo let go of the converted array with its source: a new mask converts afresh
    pad2 = torch.zeros(2, 1, 1, 17)
    assert close(tracea.ops.attention(q, k, v, pad2), ref(q, k, v, pad2.expand(2, 1, 9, 17)))
    assert conversions["n"] == 3


def test_inference_tensors_are_converted_every_call(conversions):
    q, k, v, g = inputs(1, 2, 7, 10, 2)
    with torch.inference_mode():
        mask = torch.rand(1, 1, 7, 10, generator=g) < 0.5
        mask[..., 0] = True
        for _ in range(2):
            assert close(tracea.ops.attention(q, k, v, mask), ref(q, k, v, mask))
        mask[..., 1:4] = ~mask[..., 1:4]  # inference tensors keep no version counter
        assert close(tracea.ops.attention(q, k, v, mask), ref(q, k, v, mask))
    assert conversions["n"] == 3


def test_adapter_version_and_capture_hooks():
    a = TorchAdapter()
    t = torch.zeros(3)
    v0 = a.version(t)
    t.add_(1)
    assert a.version(t) != v0
    assert a.capturing(t) is False  # a CPU tensor is never captured
    with torch.inference_mode():
        assert a.version(torch.zeros(2)) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["bool", "padding"])
def test_cuda_mask_memo_eager_and_graph_replays_follow_the_mask(kind):
    """On the GPU (flash_mma / decode kernels): the memo is reused eagerly and dropped after an in-place
    write; a call captured in a CUDA graph (after eager calls filled the memo) converts inside the capture,
    so replays after the mask is refilled in place follow its new contents."""
    g = torch.Generator(device="cuda").manual_seed(3)
    b, h, sq, skv = 2, 4, 70, 136
    q = torch.randn(b, h, sq, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, h, skv, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))

    def fresh() -> torch.Tensor:
        if kind == "bool":
            m = torch.rand(b, 1, sq, skv, device="cuda", generator=g) < 0.6
            m[..., 0] = True
            return m
        m = torch.zeros(b, 1, 1, skv, device="cuda", dtype=torch.bfloat16)  # broadcast over seq_q: expanded
        m[..., : int(torch.randint(1, skv - 1, (1,), device="cuda", generator=g))] = float("-inf")
        return m

    def want(m: torch.Tensor) -> torch.Tensor:
        return ref(q.cpu(), k.cpu(), v.cpu(), m.cpu().expand(b, 1, sq, skv) if kind == "padding" else m.cpu())

    mask = fresh()
    call = lambda: tracea.ops.attention(q, k, v, mask)  # noqa: E731
    for _ in range(2):
        assert float((call().double().cpu() - want(mask)).abs().max()) < 3e-2
    mask.copy_(fresh())  # in place: converted again
    assert float((call().double().cpu() - want(mask)).abs().max()) < 3e-2
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            out = call()
    for _ in range(2):
        mask.copy_(fresh())
        graph.replay()
        torch.cuda.synchronize()
        assert float((out.double().cpu() - want(mask)).abs().max()) < 3e-2
