"""NaN and Inf through the CPU attention kernel (online softmax), against the float64 reference and
``torch.nn.functional.scaled_dot_product_attention`` in float64.

The rule (docs/architecture.md, "Numerics"): ``softmax(masked_fill(scale q k^T, mask, -inf)) @ v`` in
IEEE arithmetic. A NaN or +Inf logit makes its row NaN; a row whose logits are all -Inf gets weights
0 (PyTorch's convention); a causally masked key's k never matters, but its weight 0 still multiplies
its v. The kernel used to drop them: one NaN in k gave no NaN at all, Inf in k or -Inf in q gave
finite rows where PyTorch gives NaN (its exp clamped NaN away and exp(-inf) was not 0)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import AttentionOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import ISAS, HAVE_CC, attention_ref, config, poisoned, rand, run_variant
from tracea_cpu.variants import CpuAttentionVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim): several query and key blocks, GQA, seq_q != seq_kv
CASES = [(1, 4, 2, 37, 53, 16), (2, 2, 2, 70, 70, 8), (1, 4, 1, 20, 100, 33), (1, 2, 2, 100, 30, 64)]


def _attention(isa: str, hero: dict, op: AttentionOp, q, k, v) -> np.ndarray:
    out = poisoned(q.shape)
    run_variant(CpuAttentionVariant(ISA_BY_NAME[isa]), op, config(**hero, threads=2), {"q": q, "k": k, "v": v}, out)
    return out


def _inputs(rng, case):
    b, h, kvh, sq, skv, d = case
    return rand(rng, b, h, sq, d), rand(rng, b, kvh, skv, d), rand(rng, b, kvh, skv, d)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_random_nonfinite_against_reference(isa, causal):
    rng = np.random.default_rng([len(isa), int(causal)])
    for hero in ATTN_HEROES[isa]:
        for case in CASES:
            b, h, kvh, sq, skv, d = case
            op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh)
            for trial in range(4):
                q, k, v = _inputs(rng, case)
                injected = [(name, inject_nonfinite(rng, arr, 1))
                            for name, arr in (("q", q), ("k", k), ("v", v))[trial % 3:] if rng.integers(2) or trial < 3]
                out = _attention(isa, hero, op, q, k, v)
                with np.errstate(invalid="ignore", over="ignore"):
                    ref = attention_ref(q, k, v, op)
                msg = nonfinite_mismatch(out, ref)
                assert msg is None, f"{isa} {hero} {case} causal={causal} injected {injected}: {msg}"


@pytest.mark.parametrize("isa", ISAS)
def test_one_nan_in_k_poisons_the_rows_that_see_it(isa):
    rng = np.random.default_rng(11)
    q, k, v = _inputs(rng, (1, 2, 1, 40, 40, 16))
    k[0, 0, 25, 3] = np.nan
    for causal in (False, True):
        op = AttentionOp(1, 2, 40, 40, 16, causal=causal, kv_heads=1)
        out = _attention(isa, ATTN_HEROES[isa][0], op, q, k, v)
        rows = np.isnan(out).all(axis=-1)  # (b, h, sq): whole rows
        expect = np.broadcast_to(np.arange(40) >= (25 if causal else 0), (1, 2, 40))
        assert np.array_equal(rows, expect), (causal, rows.astype(int))
        assert not np.isnan(out[~rows]).any()


@pytest.mark.parametrize("isa", ISAS)
def test_rows_of_all_minus_inf_logits_give_zeros(isa):
    """q = -inf in one dimension where every key is positive: all logits -inf, weights 0 (PyTorch)."""
    rng = np.random.default_rng(12)
    q, k, v = _inputs(rng, (1, 1, 1, 9, 21, 8))
    k[..., 2] = np.abs(k[..., 2]) + 0.5
    q[0, 0, 4, 2] = -np.inf
    op = AttentionOp(1, 1, 9, 21, 8, kv_heads=1)
    out = _attention(isa, ATTN_HEROES[isa][0], op, q, k, v)
    assert (out[0, 0, 4] == 0).all()
    assert np.isfinite(out).all()


@pytest.mark.parametrize("isa", ISAS)
def test_causal_nan_in_v_beyond_the_row_block_still_reaches_earlier_rows(isa):
    """Weight 0 (masked) times NaN is NaN: the kernel never reads keys after a row block's last visible
    one, so this takes the path that finds them when V is packed."""
    rng = np.random.default_rng(13)
    q, k, v = _inputs(rng, (1, 2, 1, 90, 90, 16))
    v[0, 0, 80, 5] = np.nan
    v[0, 0, 60, 7] = -np.inf
    op = AttentionOp(1, 2, 90, 90, 16, causal=True, kv_heads=1)
    out = _attention(isa, ATTN_HEROES[isa][0], op, q, k, v)
    assert np.isnan(out[..., 5]).all()
    assert np.isnan(out[:, :, :60, 7]).all() and np.isneginf(out[:, :, 60:, 7]).all()
    assert np.isfinite(np.delete(out, [5, 7], axis=-1)).all()


# PyTorch float64 SDPA, same inputs. Left out (documented in docs/architecture.md): NaN in q, and NaN in
# the only key a causal row sees -- rows whose every logit is NaN, which PyTorch's CPU flash kernel
# returns as 0 or NaN depending on where they fall in its vector loop (its math backend gives NaN, as
# we do).
TORCH_INJECTIONS = [("k", np.nan), ("k", np.inf), ("k", -np.inf), ("q", np.inf), ("q", -np.inf),
                    ("v", np.nan), ("v", np.inf), ("v", -np.inf)]


@pytest.mark.torch
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_nonfinite_against_torch_sdpa(isa, causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng([7, int(causal), len(isa)])
    for case in CASES:
        b, h, kvh, sq, skv, d = case
        op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh)
        for name, value in TORCH_INJECTIONS:
            q, k, v = _inputs(rng, case)
            arr = {"q": q, "k": k, "v": v}[name]
            idx = tuple(int(rng.integers(0, n)) for n in arr.shape)
            if name == "k":
                idx = idx[:2] + (max(1, idx[2]),) + idx[3:]  # not key 0: causal row 0 sees only it
            arr[idx] = value
            out = _attention(isa, ATTN_HEROES[isa][0], op, q, k, v)
            tq, tk, tv = (torch.from_numpy(x.astype(np.float64)) for x in (q, k, v))
            expect = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                                      enable_gqa=kvh != h).numpy()
            msg = nonfinite_mismatch(out, expect)
            assert msg is None, f"{isa} {case} causal={causal} {name}{idx} = {value}: {msg}"
