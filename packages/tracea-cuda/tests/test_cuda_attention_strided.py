"""GPU: the CUDA attention kernels on strided q / k / v as models pass them (Hugging Face's
``x.view(B, S, H, D).transpose(1, 2)``, timm ViT's packed qkv, sliced KV caches), through
``tracea.ops.attention`` on torch tensors against a float64 reference on fresh random inputs: odd sequence
lengths (197, 77, 1), GQA, causal, bool / additive masks, split-KV, decode, the log-sum-exp output, CUDA
graph capture; the output in q's storage order (so ``out.transpose(1, 2).reshape(B, S, H * D)`` is a view).
The wgmma cases need a Hopper GPU, the others any GPU of compute capability 8.0 or more."""

from __future__ import annotations

import pytest

from tracea_cuda import testing as T
from tracea_cuda.testing_attention import attention_ref as _ref, graph_replays, rel as _rel

TOL = {"float16": 4e-3, "bfloat16": 2e-2}
FLASH, WGMMA = "cuda.attention.flash_mma", "cuda.attention.wgmma"


def _cc() -> tuple[int, int]:
    if not T.gpu_available():
        return (0, 0)
    import torch

    return torch.cuda.get_device_capability()


pytestmark = [pytest.mark.cuda, pytest.mark.skipif(_cc() < (8, 0), reason="needs a GPU (sm_80+), CuPy and torch")]
VARIANTS = [FLASH, pytest.param(WGMMA, marks=pytest.mark.skipif(_cc() != (9, 0), reason="needs a Hopper GPU"))]


def _layout(kind: str, b: int, h: int, kvh: int, sq: int, skv: int, d: int, dt: str, seed: int):  # noqa: ANN202
    """q, k, v of logical shapes (b, h, sq, d), (b, kvh, skv, d) laid out as ``kind``."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    if kind == "bshd":  # Hugging Face: view(B, S, H, D).transpose(1, 2)
        return (rnd(b, sq, h, d).transpose(1, 2), rnd(b, skv, kvh, d).transpose(1, 2),
                rnd(b, skv, kvh, d).transpose(1, 2))
    if kind == "vit":  # timm: qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        assert h == kvh and sq == skv
        return rnd(b, sq, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    if kind == "slice":  # q BSHD, k / v a window of a longer (B, KVH, L, D) cache
        return (rnd(b, sq, h, d).transpose(1, 2), rnd(b, kvh, skv + 40, d)[:, :, 8:8 + skv],
                rnd(b, kvh, skv + 40, d)[:, :, 8:8 + skv])
    raise AssertionError(kind)


CASES = [  # (layout, B, H, KVH, Sq, Skv, D)
    ("vit", 4, 6, 6, 197, 197, 64), ("bshd", 2, 12, 12, 77, 77, 64), ("bshd", 1, 16, 16, 1024, 1024, 128),
    ("bshd", 2, 8, 2, 200, 333, 128), ("bshd", 3, 4, 1, 1, 1, 64), ("slice", 2, 8, 4, 129, 300, 64),
    ("slice", 1, 4, 4, 513, 5, 128), ("vit", 8, 3, 3, 49, 49, 32), ("bshd", 2, 2, 2, 3136, 49, 32),
]


def _strided_output(out) -> bool:  # noqa: ANN001
    """Whether ``out`` (B, H, S, D) is a view of (B, S, H, D) memory, as PyTorch's flash SDPA returns."""
    return out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_strided_operands_match_float64(variant, dt, causal, case):
    import tracea

    kind, *dims = case
    if variant == WGMMA and dims[-1] == 32:
        pytest.skip("cuda.attention.wgmma serves head dims 64 and 128")
    q, k, v = _layout(kind, *dims, dt, sum(dims) + causal)
    ref = _ref(q, k, v, causal=causal)
    for call in range(2):  # the first call builds the plan, the second runs it
        out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True, variant=variant)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert _rel(out, ref) < TOL[dt], call
        if dims[1] > 1 and dims[3] > 1:  # the kernel wrote q's storage order itself (no packed copy)
            assert _strided_output(out), (call, out.stride())


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_strided_operands_with_masks(kind):
    import torch

    import tracea

    g = torch.Generator(device="cuda").manual_seed(5)
    for b, h, kvh, sq, skv, d, mshape in [(2, 4, 2, 70, 130, 64, (2, 1, 70, 130)), (1, 8, 8, 33, 257, 128, (33, 257)),
                                          (2, 4, 4, 197, 197, 64, (2, 4, 197, 197))]:
        q, k, v = _layout("bshd", b, h, kvh, sq, skv, d, "bfloat16", sq)
        if kind == "bool":
            mask = torch.rand(mshape, device="cuda", generator=g) < 0.7
        else:
            mask = (torch.rand(mshape, device="cuda", generator=g) * 3 - 2).bfloat16()
        for variant in (FLASH, None):  # forced, and the default path (flash_mma serves masks)
            out = tracea.ops.attention(q, k, v, mask, scale=0.1, enable_gqa=True, variant=variant)
            assert _rel(out, _ref(q, k, v, mask, scale=0.1)) < TOL["bfloat16"], (b, h, sq, skv, variant)
            assert _strided_output(out)


@pytest.mark.parametrize("splits", [2, 8])
def test_strided_split_kv(splits):
    """Split-KV partials stay packed; the combine kernel stores through the output's strides."""
    import tracea
    from tracea_cuda.variants.base import hero

    q, k, v = _layout("bshd", 2, 8, 2, 3, 3000, 128, "bfloat16", splits)
    for bm in (16, 64):
        out = tracea.ops.attention(q, k, v, enable_gqa=True, variant=FLASH,
                                   config=hero(bm, 64, 128, 2, bm // 16, mt=1, splits=splits))
        assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"], (bm, splits)
        assert _strided_output(out)


def test_decode_with_strided_cache():
    """One-token decode over a sliced (strided) KV cache: the default path (the decode kernel takes packed
    operands, which dispatch packs for it)."""
    import tracea

    q, k, v = _layout("slice", 2, 32, 8, 1, 4000, 128, "bfloat16", 3)
    for _ in range(2):
        out = tracea.ops.attention(q, k, v, enable_gqa=True)
        assert _rel(out, _ref(q, k, v)) < TOL["bfloat16"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_log_sum_exp(variant):
    import torch

    import tracea
    from tracea_cuda.testing_attention import lse_close

    q, k, v = _layout("vit", 2, 4, 4, 197, 197, 64, "float16", 8)
    out, lse = tracea.ops.attention(q, k, v, is_causal=True, variant=variant, return_lse=True)
    ref, ref_lse = _ref(q, k, v, causal=True, return_lse=True)
    assert _rel(out, ref) < TOL["float16"]
    assert lse.dtype == torch.float32 and lse_close(lse, ref_lse) is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_cuda_graph_capture_and_replay(variant):
    import tracea

    q, k, v = _layout("bshd", 2, 8, 4, 300, 300, 128, "float16", 11)
    base = [t._base if t._base is not None else t for t in (q, k, v)]  # refilled in place, views unchanged
    call = lambda: tracea.ops.attention(q, k, v, is_causal=True, enable_gqa=True, variant=variant)  # noqa: E731
    for seed, out in graph_replays(call, tuple(base)):
        assert _rel(out, _ref(q, k, v, causal=True)) < TOL["float16"], seed
        assert _strided_output(out)


def test_default_path_matches_pytorch_and_its_layout():
    """The default path on Hugging Face style operands: PyTorch's SDPA values, and an output whose
    ``transpose(1, 2).reshape(B, S, H * D)`` is a view, as with PyTorch's."""
    import torch
    import torch.nn.functional as F

    import tracea

    for kind, dims in (("bshd", (2, 12, 12, 256, 256, 64)), ("vit", (8, 6, 6, 197, 197, 64)),
                       ("bshd", (1, 16, 4, 1024, 1024, 128))):
        q, k, v = _layout(kind, *dims, "bfloat16", 21)
        for causal in (False, True):
            out = tracea.ops.attention(q, k, v, is_causal=causal, enable_gqa=True)
            want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
            b, h, s, d = out.shape
            flat = out.transpose(1, 2).reshape(b, s, h * d)
            assert flat.data_ptr() == out.data_ptr() and _strided_output(out), (kind, out.stride())


@pytest.mark.parametrize("variant", VARIANTS)
def test_run_with_packed_arrays_for_a_strided_op(variant):
    """The tuner's path: ``run`` on a strided op's fresh packed inputs reads them as packed (the strides of
    the arrays it is given, not the op's), and on the strided arrays themselves as strided."""
    import torch

    from tracea.doctor.doctor import get_doctor
    from tracea.doctor.variant import OpArgs
    from tracea.ir.ops import AttentionOp
    from tracea_torch.adapter import TorchAdapter, device_of

    q, k, v = _layout("bshd", 2, 8, 2, 100, 150, 64, "bfloat16", 4)
    bshd = (100 * 8 * 64, 64, 8 * 64)
    kv = (150 * 2 * 64, 64, 2 * 64)
    op = AttentionOp(2, 8, 100, 150, 64, kv_heads=2, dtype="bfloat16", strides=bshd + kv + kv + bshd)
    var = get_doctor().registry.get(variant)
    assert var.takes_strides(op)
    profile = get_doctor().profile_for(device_of(q.device))
    cfg = var.hero_configs(op, profile)[0]
    ref = _ref(q, k, v)
    packed = [t.contiguous() for t in (q, k, v)]
    out = torch.empty(2, 8, 100, 64, device="cuda", dtype=torch.bfloat16)
    var.run(op, cfg, OpArgs(dict(zip("qkv", packed)), out, TorchAdapter()), profile)
    assert _rel(out, ref) < TOL["bfloat16"]
    out2 = torch.empty(2, 100, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    var.run(op, cfg, OpArgs({"q": q, "k": k, "v": v}, out2, TorchAdapter()), profile)
    assert _rel(out2, ref) < TOL["bfloat16"]
