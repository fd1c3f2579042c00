"""Boolean and additive attention masks in the CPU attention kernel, against the float64 reference:
broadcast batch / head extents, GQA, causal together with a mask, odd sequence lengths (not multiples
of the key block), rows whose keys are all masked (weights 0, PyTorch's convention) and NaN / Inf."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import AttentionOp
from tracea.reference import kernels as ref_kernels
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import ISAS, HAVE_CC, config, poisoned, rand, run_variant
from tracea_cpu.variants import CpuAttentionVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim, mask_batch, mask_heads, causal)
CASES = [(2, 4, 2, 37, 53, 16, 2, 4, False), (2, 2, 2, 19, 70, 8, 1, 1, True), (1, 4, 1, 20, 100, 33, 1, 4, False),
         (3, 2, 2, 65, 31, 64, 3, 1, True)]


def _mask(rng, kind: str, shape) -> np.ndarray:
    if kind == "bool":
        m = (rng.uniform(size=shape) < 0.7).astype(np.float32)
        m[..., 0, :] = 0.0  # a fully masked row: weights 0, output 0
        return m
    return rng.uniform(-3.0, 1.0, size=shape).astype(np.float32)


def _run(isa: str, hero: dict, op: AttentionOp, arrays: dict) -> np.ndarray:
    out = poisoned((op.batch, op.heads, op.seq_q, op.head_dim))
    run_variant(CpuAttentionVariant(ISA_BY_NAME[isa]), op, config(**hero, threads=2), arrays, out)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masked_attention_against_reference(isa: str, kind: str) -> None:
    rng = np.random.default_rng([len(isa), len(kind)])
    for hero in ATTN_HEROES[isa][:2]:
        for b, h, kvh, sq, skv, d, mb, mh, causal in CASES:
            op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, mask=kind, mask_shape=(mb, mh))
            arrays = {"q": rand(rng, b, h, sq, d), "k": rand(rng, b, kvh, skv, d), "v": rand(rng, b, kvh, skv, d),
                      "mask": _mask(rng, kind, (mb, mh, sq, skv))}
            out = _run(isa, hero, op, arrays)
            ref = ref_kernels.attention(op, arrays["q"], arrays["k"], arrays["v"], arrays["mask"])
            err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert err < 1e-5, f"{isa} {hero} {kind} {(b, h, kvh, sq, skv, d, mb, mh, causal)}: rel err {err:.2e}"
            if kind == "bool" and not causal:
                assert np.all(out[:, :, 0, :] == 0.0)  # the fully masked row


@pytest.mark.parametrize("isa", ISAS)
def test_masked_attention_nonfinite_as_reference(isa: str) -> None:
    """NaN / Inf in q, k, v and in an additive mask; a bool-masked key's k never matters (its logit is
    replaced), its v still meets weight 0 (NaN)."""
    rng = np.random.default_rng(7)
    hero = ATTN_HEROES[isa][0]
    for kind in ("bool", "additive"):
        for trial in range(6):
            b, h, kvh, sq, skv, d, mb, mh, causal = CASES[trial % len(CASES)]
            op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, mask=kind, mask_shape=(mb, mh))
            arrays = {"q": rand(rng, b, h, sq, d), "k": rand(rng, b, kvh, skv, d), "v": rand(rng, b, kvh, skv, d),
                      "mask": _mask(rng, kind, (mb, mh, sq, skv))}
            names = ["q", "k", "v"] + (["mask"] if kind == "additive" else [])
            inject_nonfinite(rng, arrays[names[trial % len(names)]], 1)
            out = _run(isa, hero, op, arrays)
            with np.errstate(invalid="ignore", over="ignore"):
                ref = ref_kernels.attention(op, arrays["q"], arrays["k"], arrays["v"], arrays["mask"])
            msg = nonfinite_mismatch(out, ref)
            assert msg is None, f"{isa} {kind} trial {trial}: {msg}"
