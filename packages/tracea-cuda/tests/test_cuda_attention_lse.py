"""GPU: the log-sum-exp output (``tracea.ops.attention(..., return_lse=True)``) of every CUDA attention variant
against a float64 reference on fresh random inputs: odd lengths, causal, GQA / MQA, seq_q != seq_kv, split-KV
(flash_mma's combine kernel, the decode kernel's last-block merge), boolean and additive masks with fully
masked rows (lse -inf, output 0), CUDA graph capture (skipped without a GPU; wgmma cases without a Hopper)."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_inputs, attention_ref, graph_replays, lse_close, rel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

TOL = {"float16": 4e-3, "bfloat16": 2e-2}


def _hopper() -> bool:
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


def _check(variant, case, dt, causal=False, mask=None, scale=None, config=None, seed=0):  # noqa: ANN001, ANN202
    import tracea

    q, k, v = attention_inputs(case, dt, seed + sum(case))
    out, lse = tracea.ops.attention(q, k, v, mask, is_causal=causal, scale=scale, enable_gqa=True, variant=variant,
                                    config=config, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, mask, causal=causal, scale=scale, return_lse=True)
    assert out.shape == q.shape and lse.shape == q.shape[:3] and str(lse.dtype) == "torch.float32"
    assert rel(out, ref) < TOL[dt], (variant, case, causal)
    msg = lse_close(lse, ref_lse)
    assert msg is None, (variant, case, causal, msg)
    return q, k, v, out, lse


CASES = [  # (B, H, KVH, Sq, Skv, D)
    (2, 4, 4, 128, 128, 64), (1, 8, 2, 200, 333, 128), (2, 4, 1, 77, 77, 64), (1, 4, 4, 513, 5, 128),
    (1, 32, 8, 1, 4099, 128), (2, 8, 8, 3, 777, 64),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("variant", ["cuda.attention.flash_mma", "cuda.attention.wgmma", None])
def test_lse_matches_float64(variant, case, causal):
    if variant == "cuda.attention.wgmma" and not _hopper():
        pytest.skip("needs a Hopper GPU")
    _check(variant, case, "bfloat16" if causal else "float16", causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", [(1, 32, 8, 1, 4099, 128), (3, 32, 8, 4, 3001, 128), (2, 8, 2, 8, 515, 64),
                                  (1, 16, 1, 1, 2049, 64), (2, 4, 4, 1, 5, 128)])
def test_decode_lse_every_split_path(case, causal):
    """The decode kernel with its default split count and forced ones (1: the block writes it; 7, 64: the
    last block of each row block merges the splits' log-sum-exps)."""
    from tracea_cuda.variants.base import hero

    for splits in (0, 1, 7, 64):
        cfg = hero(16, 16, case[-1], 3, 8, splits=splits)
        _check("cuda.attention.decode", case, "bfloat16", causal, config=cfg, seed=splits)


def test_flash_mma_split_kv_lse():
    """flash_mma's split-KV path: the combine kernel writes the log-sum-exp."""
    from tracea_cuda.variants.base import hero

    for splits in (1, 3, 16):
        cfg = hero(16, 64, 128, 2, 1, mt=1, splits=splits)
        _check("cuda.attention.flash_mma", (2, 32, 8, 1, 5000, 128), "bfloat16", config=cfg, seed=splits)


@pytest.mark.parametrize("variant", ["cuda.attention.flash_mma", "cuda.attention.decode"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_lse_with_masks_and_fully_masked_rows(variant, kind):
    import torch

    g = torch.Generator(device="cuda").manual_seed(4)
    for case in ((2, 8, 2, 1, 3000, 128), (1, 8, 8, 5, 257, 64), (2, 8, 2, 70, 300, 64)):
        b, h, kvh, sq, skv, d = case
        if variant == "cuda.attention.decode" and (h // kvh) * sq > 32:
            continue
        if kind == "bool":
            mask = torch.rand(b, h, sq, skv, device="cuda", generator=g) < 0.7
            mask[0, 1] = False  # a fully masked head: lse -inf, output 0
        else:
            mask = (torch.rand(b, 1, sq, skv, device="cuda", generator=g) * 3 - 2).half()
            mask[0, :, 0] = float("-inf")  # a fully masked query row of every head of batch 0
        _, _, _, out, lse = _check(variant, case, "float16", mask=mask, scale=0.15)
        if kind == "bool":
            assert torch.all(out[0, 1] == 0) and torch.all(lse[0, 1] == float("-inf"))
        else:
            assert torch.all(out[0, :, 0] == 0) and torch.all(lse[0, :, 0] == float("-inf"))


def test_default_path_with_lse_gives_the_same_output():
    import torch

    import tracea

    for case, causal in (((2, 16, 16, 512, 512, 128), False), ((1, 32, 8, 1, 8192, 128), False),
                         ((2, 8, 8, 300, 300, 64), True)):
        q, k, v = attention_inputs(case, "bfloat16", 3)
        plain = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True)
        out, lse = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
        torch.testing.assert_close(out, plain, atol=0, rtol=0)
        ref_lse = attention_ref(q, k, v, causal=causal, return_lse=True)[1]
        assert lse_close(lse, ref_lse) is None, case


def test_lse_call_is_captured_in_a_cuda_graph():
    import torch

    import tracea

    q, k, v = attention_inputs((2, 32, 8, 1, 6000, 128), "bfloat16", 12)
    for _, (out, lse) in graph_replays(lambda: tracea.ops.attention(q, k, v, enable_gqa=True, return_lse=True), (q, k, v)):
        eager, eager_lse = tracea.ops.attention(q, k, v, enable_gqa=True, return_lse=True)
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
        torch.testing.assert_close(lse, eager_lse, atol=0, rtol=0)
