"""The CPU attention kernel's log-sum-exp output (``AttentionOp.lse``) against a float64 logsumexp of the
scaled, masked logits computed here: odd lengths, causal, GQA, boolean and additive masks, fully masked
rows (-inf), through the variant's ``run`` and its bound launcher (``tracea.ops.attention(...,
return_lse=True)`` on NumPy arrays)."""

from __future__ import annotations

import numpy as np
import pytest

import tracea
from tracea.ir.ops import AttentionOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import ISAS, HAVE_CC, config, poisoned, rand, run_variant
from tracea_cpu.variants import CpuAttentionVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, mask)
CASES = [(2, 4, 2, 37, 53, 16, False, None), (1, 2, 2, 19, 70, 8, True, None), (2, 4, 1, 20, 100, 33, False, "bool"),
         (3, 2, 2, 65, 31, 64, True, "additive"), (1, 3, 3, 1, 257, 24, False, "additive")]


def _lse64(q, k, v, scale, causal, mask, kind):  # noqa: ANN001, ANN202
    rep = q.shape[1] // k.shape[1]
    k64 = np.repeat(k.astype(np.float64), rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k64) * scale
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] > np.arange(s.shape[-2])[:, None], -np.inf, s)
    if kind == "bool":
        s = np.where(mask != 0, s, -np.inf)
    elif kind == "additive":
        s = s + mask.astype(np.float64)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)
    with np.errstate(divide="ignore"):
        return (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]


def _case(rng, b, h, kvh, sq, skv, d, kind):  # noqa: ANN001, ANN202
    q, k, v = rand(rng, b, h, sq, d), rand(rng, b, kvh, skv, d), rand(rng, b, kvh, skv, d)
    mask = None
    if kind == "bool":
        mask = (rng.uniform(size=(b, h, sq, skv)) < 0.7).astype(np.float32)
        mask[0, 0, 1] = 0.0  # a fully masked row: lse -inf, output 0
    elif kind == "additive":
        mask = rng.uniform(-3.0, 1.0, size=(b, 1, sq, skv)).astype(np.float32)
        mask[-1, 0, 0] = -np.inf
    return q, k, v, mask


def _close(got: np.ndarray, ref: np.ndarray) -> bool:
    fin = np.isfinite(ref)
    return bool(np.array_equal(np.isneginf(got), np.isneginf(ref))
                and np.all(np.abs(got[fin] - ref[fin]) <= 1e-5 * (1 + np.abs(ref[fin]))))


@pytest.mark.parametrize("isa", ISAS)
def test_cpu_kernel_lse_against_float64(isa: str) -> None:
    rng = np.random.default_rng(len(isa))
    for hero in ATTN_HEROES[isa][:2]:
        for b, h, kvh, sq, skv, d, causal, kind in CASES:
            q, k, v, mask = _case(rng, b, h, kvh, sq, skv, d, kind)
            mshape = None if mask is None else mask.shape[:2]
            op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, mask=kind, mask_shape=mshape, lse=True)
            lse = np.full((b, h, sq), np.nan, dtype=np.float32)
            out = poisoned((b, h, sq, d))
            run_variant(CpuAttentionVariant(ISA_BY_NAME[isa]), op, config(**hero, threads=2),
                        {"q": q, "k": k, "v": v, "mask": mask, "lse": lse}, out)
            ref = _lse64(q, k, v, op.scale, causal, mask, kind)
            assert _close(lse, ref), f"{isa} {hero} {(b, h, kvh, sq, skv, d, causal, kind)}"
            assert not np.isnan(out).any()


def test_ops_attention_return_lse_on_numpy() -> None:
    """The public call: (out, lse) with lse float32 (..., heads, seq_q); the same out as without it;
    a 3-D call gives a 2-D lse; the plan cache serves the second call."""
    rng = np.random.default_rng(5)
    for b, h, kvh, sq, skv, d, causal, kind in CASES:
        q, k, v, mask = _case(rng, b, h, kvh, sq, skv, d, kind)
        if kind == "bool":
            mask = mask != 0
        for _ in range(2):
            out, lse = tracea.ops.attention(q, k, v, mask, is_causal=causal, return_lse=True)
            assert lse.shape == (b, h, sq) and lse.dtype == np.float32
            plain = tracea.ops.attention(q, k, v, mask, is_causal=causal)
            np.testing.assert_array_equal(out, plain)
            assert _close(lse, _lse64(q, k, v, d ** -0.5, causal, mask, kind)), (b, h, kvh, sq, skv, d, causal, kind)
    q, k, v = rand(rng, 4, 9, 16), rand(rng, 4, 11, 16), rand(rng, 4, 11, 16)
    out, lse = tracea.ops.attention(q, k, v, return_lse=True)
    assert out.shape == (4, 9, 16) and lse.shape == (4, 9)
    ref = _lse64(q[None], k[None], v[None], 0.25, False, None, None)[0]
    assert _close(lse, ref)
