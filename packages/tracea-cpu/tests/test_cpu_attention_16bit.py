"""The CPU attention kernel on bfloat16 / float16 operands (widened as they are loaded, float32 arithmetic, the
output rounded once), through ``tracea.ops.attention`` on torch CPU tensors pinned to each ISA's variant, against
PyTorch's SDPA in float64 on the same 16-bit values: odd shapes, causal, GQA decode, boolean and 16-bit additive
masks, timm's strided qkv views, NaN / Inf where the reference has them, the output rounding."""

from __future__ import annotations

import pytest

from tracea_cpu.emit.attention import ELEMENTS
from tracea_cpu.testing import HAVE_CC, ISAS, PROFILE

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not HAVE_CC, reason="no C compiler")]

import torch.nn.functional as F  # noqa: E402

import tracea  # noqa: E402
from tracea.runtime import fallbacks  # noqa: E402

ELEM = {torch.bfloat16: "bf16", torch.float16: "f16"}
#: (ISA, dtype) pairs this machine runs; bf16 on AVX-512 twice where the CPU has AVX512_BF16: Q K^T on
#: ``vdpbf16ps`` ("avx512-dot") and on widened fp32 FMAs
PAIRS = [(isa, dt) for isa in ISAS for dt in ELEM if ELEM[dt] in ELEMENTS.get(isa, ())]
if "avx512" in ISAS and PROFILE.has("avx512_bf16"):
    PAIRS.append(("avx512-dot", torch.bfloat16))
#: one 16-bit rounding of the output plus float32 accumulation (bf16: 8 significant bits, fp16: 11)
TOL = {torch.bfloat16: 6e-3, torch.float16: 8e-4}
# (batch, heads, kv_heads, seq_q, seq_kv, head_dim)
CASES = [(1, 1, 1, 1, 1, 1), (2, 4, 2, 17, 33, 24), (1, 2, 2, 70, 50, 64), (1, 3, 1, 50, 70, 80),
         (2, 2, 2, 64, 64, 13), (1, 2, 1, 129, 97, 128), (2, 3, 3, 197, 197, 64), (1, 32, 8, 1, 300, 128)]


def _ref(q, k, v, mask=None, causal=False, gqa=False):
    m = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, is_causal=causal,
                                          enable_gqa=gqa)


@pytest.fixture(autouse=True)
def _dot_path(request, monkeypatch):
    """``avx512-dot`` runs the AVX-512 variant with the dot-product S tile, plain ``avx512`` without it."""
    from tracea.runtime import plans
    from tracea_cpu import attention

    isa = request.node.callspec.params.get("isa", "") if hasattr(request.node, "callspec") else ""
    monkeypatch.setenv("TRACEA_CPU_BF16_DOT", "1" if isa.endswith("-dot") else "0")
    attention._attention_plan.cache_clear()
    plans.invalidate("16-bit attention test")
    yield
    attention._attention_plan.cache_clear()
    plans.invalidate("16-bit attention test")


def _run(isa, q, k, v, mask=None, causal=False, gqa=False):
    isa = isa.removesuffix("-dot")
    fallbacks.reset()
    out = tracea.ops.attention(q, k, v, mask, is_causal=causal, enable_gqa=gqa, variant=f"cpu.attention.{isa}")
    assert not fallbacks.counts(), fallbacks.counts()
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    return out


def _err(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("isa,dt", PAIRS, ids=[f"{i}-{ELEM[d]}" for i, d in PAIRS])
@pytest.mark.parametrize("causal", [False, True])
def test_16bit_shapes(isa, dt, causal):
    g = torch.Generator().manual_seed(1)
    for b, h, kvh, sq, skv, d in CASES:
        q = torch.randn(b, h, sq, d, generator=g).to(dt)
        k, v = (torch.randn(b, kvh, skv, d, generator=g).to(dt) for _ in range(2))
        out = _run(isa, q, k, v, causal=causal, gqa=kvh != h)
        assert _err(out, _ref(q, k, v, causal=causal, gqa=kvh != h)) < TOL[dt], (b, h, kvh, sq, skv, d)


@pytest.mark.parametrize("isa,dt", PAIRS, ids=[f"{i}-{ELEM[d]}" for i, d in PAIRS])
def test_16bit_masks_and_strided_views(isa, dt):
    g = torch.Generator().manual_seed(2)
    b, n, h, d = 2, 49, 3, 32
    x = torch.randn(b, n, 3, h, d, generator=g).to(dt)  # timm: one packed buffer, q / k / v strided views
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
    assert _err(_run(isa, q, k, v), _ref(q, k, v)) < TOL[dt]
    additive = (torch.randn(1, h, n, n, generator=g) * 2).to(dt)  # 16-bit additive, broadcast over batch
    assert _err(_run(isa, q, k, v, additive), _ref(q, k, v, additive)) < TOL[dt]
    keep = torch.rand(b, 1, n, n, generator=g) > 0.3
    keep[..., 0] = True
    assert _err(_run(isa, q, k, v, keep), _ref(q, k, v, keep)) < TOL[dt]


@pytest.mark.parametrize("isa,dt", PAIRS, ids=[f"{i}-{ELEM[d]}" for i, d in PAIRS])
def test_16bit_nan_inf_where_the_reference_has_them(isa, dt):
    g = torch.Generator().manual_seed(3)
    for causal in (False, True):
        q = torch.randn(1, 2, 20, 24, generator=g).to(dt)
        k, v = (torch.randn(1, 2, 20, 24, generator=g).to(dt) for _ in range(2))
        q[0, 0, 3, 5] = float("nan")
        k[0, 1, 7, 2] = float("inf")
        v[0, 1, 15, 9] = float("-inf")
        v[0, 0, 19, 1] = float("nan")  # the last key: causal rows before it never read it, yet multiply it by 0
        out, ref = _run(isa, q, k, v, causal=causal), _ref(q, k, v, causal=causal)
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf()), causal
        fin = ref.isfinite()
        assert _err(out[fin], ref[fin]) < TOL[dt]


@pytest.mark.parametrize("isa,dt", PAIRS, ids=[f"{i}-{ELEM[d]}" for i, d in PAIRS])
def test_16bit_output_is_rounded_once(isa, dt):
    """The output is the float32 result rounded to nearest even: identical to rounding the float32
    kernel's output on the same (widened) operands."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 37, 40, generator=g).to(dt) for _ in range(3))
    wide = tracea.ops.attention(q.float(), k.float(), v.float(), variant=f"cpu.attention.{isa.removesuffix('-dot')}")
    out = _run(isa, q, k, v)
    same = (out == wide.to(dt)).float().mean().item()
    assert same > 0.995, same  # (float32 sums may differ in the last bit between the two builds' orders)


def test_16bit_patched_sdpa_serves_natively():
    """A patched 16-bit SDPA on the CPU runs the 16-bit kernel itself (no widened copies) when one exists."""
    tracea_torch = pytest.importorskip("tracea_torch")
    if not any(ELEM[torch.bfloat16] in ELEMENTS.get(isa, ()) for isa in ISAS):
        pytest.skip("no bf16 attention kernel for this CPU")
    q, k, v = (torch.randn(2, 3, 50, 32).bfloat16() for _ in range(3))
    out = tracea_torch.ops.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.bfloat16 and _err(out, _ref(q, k, v)) < TOL[torch.bfloat16]


def test_16bit_declined_as_framework_faster_on_amx_cpus():
    """On a CPU with AMX PyTorch's 16-bit SDPA multiplies on tiles: the kernel stays a candidate only where a
    call is timed against PyTorch's (FrameworkFaster), float32 is unaffected."""
    import dataclasses

    from tracea.doctor.decision import FrameworkFaster
    from tracea.ir.ops import AttentionOp
    from tracea_cpu.isa import ISA_BY_NAME
    from tracea_cpu.testing import PROFILE
    from tracea_cpu.variants import CpuAttentionVariant

    amx = dataclasses.replace(PROFILE, isa=tuple(PROFILE.isa) + ("amx_tile", "amx_bf16"))
    plain = dataclasses.replace(PROFILE, isa=tuple(f for f in PROFILE.isa if not f.startswith("amx")))
    variant = CpuAttentionVariant(ISA_BY_NAME[ISAS[0]])
    for dtype in ("bfloat16", "float16"):
        op = AttentionOp(2, 3, 50, 50, 32, dtype=dtype)
        if dtype not in {d.value for d in variant.requirements.dtypes}:
            continue
        (reason,) = [r for r in variant.check(op, amx) if "AMX" in r]
        assert isinstance(reason, FrameworkFaster)
        assert not [r for r in variant.check(op, plain) if "AMX" in r]
    assert not [r for r in variant.check(AttentionOp(2, 3, 50, 50, 32), amx) if "AMX" in r]


def test_16bit_numpy_float16_strided_and_overlapping():
    """NumPy float16 arrays (no torch): slices and overlapping windows (rows sharing memory) are read through
    their strides or packed, as the float32 kernel's arrays are (found by tracea.fuzzing)."""
    import numpy as np
    from numpy.lib.stride_tricks import as_strided

    if "f16" not in ELEMENTS.get(ISAS[0], ()):
        pytest.skip("no float16 attention kernel for this CPU")
    rng = np.random.default_rng(5)
    base = rng.standard_normal((3, 40, 16)).astype(np.float16)
    q = base[:, :7, :15]
    kv = as_strided(base, shape=(3, 16, 15), strides=(38 * 2, 2 * 2, 2))  # rows overlap in memory
    before = base.copy()
    out = tracea.ops.attention(q, kv, kv, variant=f"cpu.attention.{ISAS[0]}")
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (q, kv, kv)]
    ref = _ref(*t)
    assert out.dtype == np.float16 and _err(torch.from_numpy(out), ref) < TOL[torch.float16]
    assert np.array_equal(base, before)  # inputs are read, never written


def test_16bit_first_use_tuning_persists_a_bf16_entry(tmp_path):
    """First-use tuning on bf16 torch tensors compares the candidates' outputs through float32 copies (NumPy
    holds no bf16 without ml_dtypes): every trial used to be dropped there, so no bf16 signature was tuned."""
    from tracea.tuning.cache import TuningCache, set_cache

    if "bf16" not in ELEMENTS.get(ISAS[0], ()):
        pytest.skip("no bf16 attention kernel for this CPU")
    if PROFILE.has("amx_tile", "amx_bf16"):
        pytest.skip("AMX CPU: the 16-bit kernel declines for PyTorch's SDPA (FrameworkFaster), nothing to tune")
    cache = TuningCache(tmp_path / "cache.json")
    set_cache(cache)
    tracea.set_tuning("first-use")
    try:
        q, k, v = (torch.randn(2, 3, 97, 64).bfloat16() for _ in range(3))
        out = tracea.ops.attention(q, k, v)
        assert _err(out, _ref(q, k, v)) < TOL[torch.bfloat16]
        tuned = [e for e in cache.entries() if "dtype=bfloat16" in e.op_key and e.variant.startswith("cpu.attention")]
        assert tuned, [(e.op_key, e.variant) for e in cache.entries()]
    finally:
        tracea.set_tuning(None)
        set_cache(None)
