"""GPU (Hopper): ``attn_mask`` on the wgmma flash-attention forward (``cuda.attention.wgmma``), through
``tracea.ops.attention`` on torch tensors against a float64 reference on fresh random inputs: boolean and
additive masks broadcast over batch / heads / neither, odd and even key lengths (16-bit and 32-bit mask
loads), GQA, causal and not, every masked hero, the tail split over a long cache (Hugging Face's
bottom-right chunked-prefill mask), strided (BSHD) operands, fully masked rows and -inf / NaN in an additive
mask, CUDA graph capture and replay, and the Doctor's choice. Skipped without a GPU of compute capability 9.0."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_inputs as _inputs, attention_ref as _ref, graph_replays, rel as _rel

VARIANT = "cuda.attention.wgmma"
TOL = {"float16": 4e-3, "bfloat16": 2e-2}

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not T.hopper_available(), reason="needs a Hopper GPU (sm_90), CuPy and torch")]


def _mask(kind: str, shape: tuple[int, ...], seed: int, dt: str):  # noqa: ANN202
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "bool":
        return torch.rand(shape, device="cuda", generator=g) < 0.7
    return (torch.rand(shape, device="cuda", generator=g) * 4 - 3).to(getattr(torch, dt))


# (B, H, KVH, Sq, Skv, D), mask shape ("b" / "bh" / "": broadcast over heads / none / both); more than 512
# keys visible (shorter masked ops are flash_mma's), odd and even key counts
CASES = [((2, 8, 2, 600, 777, 128), "b"), ((1, 4, 4, 600, 1024, 64), "bh"), ((2, 6, 3, 529, 1513, 64), ""),
         ((1, 16, 4, 1000, 1001, 128), "b"), ((3, 4, 1, 700, 2048, 128), "bh")]


def _mshape(case: tuple[int, ...], bcast: str) -> tuple[int, ...]:
    b, h, _, sq, skv, _ = case
    return {"b": (b, 1, sq, skv), "bh": (b, h, sq, skv), "": (sq, skv)}[bcast]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_masked_attention_matches_float64(dt, kind, causal, case):
    import tracea

    shape, bcast = case
    q, k, v = _inputs(shape, dt, sum(shape) + causal)
    mask = _mask(kind, _mshape(shape, bcast), sum(shape), dt)
    out = tracea.ops.attention(q, k, v, mask, is_causal=causal, scale=0.2, enable_gqa=True, variant=VARIANT)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, _ref(q, k, v, mask, causal=causal, scale=0.2)) < TOL[dt]


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_masked_hero_and_other_tiles(kind, d, causal):
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero
    from tracea_torch.adapter import device_of

    case = (2, 8, 2, 555, 1300, d)
    q, k, v = _inputs(case, "bfloat16", d + causal)
    mask = _mask(kind, (2, 1, 555, 1300), 7, "bfloat16")
    ref = _ref(q, k, v, mask, causal=causal)
    var = FlashAttentionWgmma()
    op = AttentionOp(2, 8, 555, 1300, d, kv_heads=2, causal=causal, dtype="bfloat16", mask=kind, mask_shape=(2, 1))
    profile = get_doctor().profile_for(device_of(q.device))
    extra = [hero(128, 128, d, 2, 12), hero(64, 64, d, 2, 8, pingpong=False, ctas=2, persistent=True, ostage=True),
             hero(128, 96, d, 2, 12, persistent=True, ostage=True), hero(128, 160, d, 2, 12, persistent=True)]
    configs = var.masked_heroes(op, profile) + [c for c in extra if var.validate_config(op, c, profile)]
    assert var.hero_configs(op, profile)[0].key == configs[0].key
    for cfg in configs:
        out = tracea.ops.attention(q, k, v, mask, is_causal=causal, enable_gqa=True, variant=VARIANT, config=cfg)
        assert _rel(out, ref) < TOL["bfloat16"], cfg.key


def test_chunked_prefill_bottom_right_mask_through_the_tail_split():
    """A 256-query chunk over an 8192-key cache with Hugging Face's boolean bottom-right causal mask (the
    masked hero cuts every item along the keys), and a lower-right ``CausalBias``; the output and the
    log-sum-exp match the float64 reference, repeated launches give the same bits."""
    import torch

    import tracea
    from tracea_cuda.testing_attention import lse_close

    b, h, kvh, sq, skv, d = 1, 32, 8, 256, 8192, 128
    q, k, v = _inputs((b, h, kvh, sq, skv, d), "bfloat16", 11)
    mask = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril(skv - sq)[None, None]
    ref, ref_lse = _ref(q, k, v, mask, return_lse=True)
    first = None
    for _ in range(2):
        out, lse = tracea.ops.attention(q, k, v, mask, enable_gqa=True, variant=VARIANT, return_lse=True)
        assert _rel(out, ref) < TOL["bfloat16"]
        assert lse_close(lse, ref_lse) is None, lse_close(lse, ref_lse)
        if first is not None:
            torch.testing.assert_close(out, first, atol=0, rtol=0)
        first = out
    from torch.nn.attention.bias import causal_lower_right

    out = tracea.ops.attention(q, k, v, causal_lower_right(sq, skv), enable_gqa=True, variant=VARIANT)
    assert _rel(out, ref) < TOL["bfloat16"]


def test_strided_operands_with_a_mask():
    """Hugging Face's BSHD views (one query head per item) with a (B, 1, Sq, Skv) padding mask."""
    import torch

    import tracea

    g = torch.Generator(device="cuda").manual_seed(4)
    b, h, kvh, s, d = 2, 8, 2, 700, 128
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.float16, generator=g).transpose(1, 2)
    k = torch.randn(b, s, kvh, d, device="cuda", dtype=torch.float16, generator=g).transpose(1, 2)
    v = torch.randn(b, s, kvh, d, device="cuda", dtype=torch.float16, generator=g).transpose(1, 2)
    keep = torch.ones(b, 1, s, s, dtype=torch.bool, device="cuda")
    keep[1, :, :, 650:] = False  # the second sequence's last 50 keys are padding
    for causal in (False, True):
        out = tracea.ops.attention(q, k, v, keep, is_causal=causal, enable_gqa=True, variant=VARIANT)
        assert _rel(out, _ref(q, k, v, keep, causal=causal)) < TOL["float16"], causal


def test_fully_masked_rows_and_nonfinite_mask_values():
    """A row whose keys are all masked gives 0 (the reference's convention); -inf in an additive mask hides
    a key; a NaN in it makes that row NaN, as in the reference."""
    import torch

    import tracea
    from tracea.testing import nonfinite_mismatch

    q, k, v = _inputs((1, 4, 2, 200, 900, 64), "float16", 9)
    keep = torch.ones(200, 900, dtype=torch.bool, device="cuda")
    keep[5] = False
    out = tracea.ops.attention(q, k, v, keep, enable_gqa=True, variant=VARIANT)
    assert torch.all(out[:, :, 5] == 0)
    add = torch.zeros(1, 4, 200, 900, dtype=torch.float16, device="cuda")
    add[0, 1, :, 17] = float("-inf")
    add[0, 2, 33, 400] = float("nan")
    got = tracea.ops.attention(q, k, v, add, enable_gqa=True, variant=VARIANT).double().cpu().numpy()
    msg = nonfinite_mismatch(got, _ref(q, k, v, add).numpy(), atol=4e-3)
    assert msg is None, msg


def test_masked_cuda_graph_capture_and_replay():
    import torch

    import tracea

    q, k, v = _inputs((2, 8, 8, 600, 600, 128), "bfloat16", 13)
    mask = torch.rand(2, 1, 600, 600, device="cuda") < 0.8
    for seed, out in graph_replays(lambda: tracea.ops.attention(q, k, v, mask, variant=VARIANT), (q, k, v)):
        assert _rel(out, _ref(q, k, v, mask)) < TOL["bfloat16"], seed


def test_default_path_picks_wgmma_for_long_masked_prefill_and_flash_mma_for_short():
    import torch

    import tracea
    from tracea.ir.ops import AttentionOp
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    q, k, v = _inputs((2, 16, 4, 1024, 1024, 128), "bfloat16", 17)
    mask = torch.rand(2, 1, 1024, 1024, device="cuda") < 0.9
    forced = tracea.ops.attention(q, k, v, mask, enable_gqa=True, variant=VARIANT)
    dflt = tracea.ops.attention(q, k, v, mask, enable_gqa=True)
    torch.testing.assert_close(dflt, forced, atol=0, rtol=0)
    assert _rel(dflt, _ref(q, k, v, mask)) < TOL["bfloat16"]
    short = AttentionOp(8, 12, 256, 256, 64, dtype="bfloat16", mask="bool", mask_shape=(8, 1))
    assert any("flash_mma" in r for r in FlashAttentionWgmma().extra_checks(short, None))  # type: ignore[arg-type]
