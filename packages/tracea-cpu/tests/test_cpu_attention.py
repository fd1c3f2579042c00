"""Attention variants against a float64 reference: causal (top-left) and not, seq_q != seq_kv, GQA,
odd head dims, every ISA this machine runs, several block shapes."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import AttentionOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import BEST, HAVE_CC, ISAS, attention_ref, config, poisoned, rand, rel_err, run_variant
from tracea_cpu.variants import CpuAttentionVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim)
CASES = [(1, 1, 1, 1, 1, 1), (2, 4, 2, 17, 33, 24), (1, 2, 2, 70, 50, 64), (1, 3, 1, 50, 70, 80),
         (1, 1, 1, 5, 40, 16), (2, 2, 2, 64, 64, 13), (1, 2, 1, 129, 97, 128)]


def attn_case(isa, case, causal, cfg=None, seed=0, scale=None):
    b, h, kvh, sq, skv, d = case
    op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, scale=scale)
    rng = np.random.default_rng(seed)
    q, k, v = rand(rng, b, h, sq, d), rand(rng, b, kvh, skv, d), rand(rng, b, kvh, skv, d)
    out = poisoned(q.shape)
    cfg = cfg or config(**ATTN_HEROES[isa][0], threads=0)
    run_variant(CpuAttentionVariant(ISA_BY_NAME[isa]), op, cfg, {"q": q, "k": k, "v": v}, out)
    return rel_err(out, attention_ref(q, k, v, op))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_attention_shapes(case, causal):
    assert attn_case(BEST, case, causal) < 1e-5


@pytest.mark.parametrize("isa", [i for i in ISAS if i != BEST])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_other_isas(isa, causal):
    for case in (CASES[1], CASES[3]):
        assert attn_case(isa, case, causal) < 1e-5


@pytest.mark.parametrize("hero", range(1, len(ATTN_HEROES[BEST])))
def test_attention_other_blocks(hero):
    cfg = config(**ATTN_HEROES[BEST][hero], threads=2)
    assert attn_case(BEST, CASES[6], True, cfg=cfg) < 1e-5
    assert attn_case(BEST, CASES[2], False, cfg=cfg, scale=0.3) < 1e-5


def test_attention_large_scores_stay_finite():
    # Scores of magnitude ~100 overflow a naive exp; the online softmax must subtract the running max.
    assert attn_case(BEST, CASES[2], True, scale=12.0) < 1e-5


@pytest.mark.parametrize("scale", [0.0, -0.7])
def test_attention_declines_non_positive_scales(scale):
    """Masked logits are -inf before the kernel applies the scale, so a zero or negative scale would turn
    them into NaN / +inf: the variant declines it (the reference computes it)."""
    from tracea.doctor.doctor import get_doctor

    variant = CpuAttentionVariant(ISA_BY_NAME[BEST])
    profile = get_doctor().profile_for("cpu")
    op = AttentionOp(1, 2, 5, 7, 16, causal=True, scale=scale)
    assert any("positive scale" in r for r in variant.check(op, profile))
    assert not any("positive scale" in r for r in variant.check(AttentionOp(1, 2, 5, 7, 16, scale=0.3), profile))
