"""The CPU attention kernel's two drivers against the float64 reference: the rows driver (a few query rows
per kv head: decode, GQA groups, class-token attention; keys read in place) and the tile driver (packed
K^T panels), each forced by the config's ``rows`` reach; softmax key blocks smaller than seq_kv (the
online rescaling), a value head dim of its own, odd head dims (partial vectors), strided operands and
output (the (batch, seq, heads, dim) views models hand to SDPA), masks (boolean / additive, broadcast),
top-left causal with seq_q != seq_kv, the log-sum-exp output, one and two threads, NaN / Inf."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import AttentionOp
from tracea.reference import kernels as ref_kernels
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import BEST, HAVE_CC, ISAS, config, poisoned, rand, run_variant
from tracea_cpu.variants import CpuAttentionVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim, head_dim_v)
DECODE = [(1, 1, 1, 1, 1, 16, 16), (2, 4, 1, 1, 37, 64, 64), (1, 8, 2, 1, 130, 128, 128), (3, 3, 3, 1, 19, 40, 40),
          (1, 4, 2, 3, 70, 80, 80), (2, 2, 2, 2, 9, 13, 24), (1, 6, 3, 1, 300, 48, 32), (1, 2, 1, 4, 5, 7, 7),
          (1, 2, 1, 1, 40, 256, 256)]
PREFILL = [(1, 2, 2, 49, 49, 32, 32), (2, 4, 2, 33, 70, 40, 40), (1, 3, 1, 70, 33, 80, 48), (1, 2, 2, 130, 300, 17, 17),
           (2, 1, 1, 7, 7, 16, 16), (1, 1, 1, 20, 30, 256, 200)]


def _op(case, causal=False, mask=None, mask_shape=None, lse=False) -> AttentionOp:
    b, h, kvh, sq, skv, d, dv = case
    return AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, head_dim_v=dv, mask=mask, mask_shape=mask_shape,
                       lse=lse)


def _arrays(rng, case, strided: bool = False) -> dict:
    """q, k, v (packed, or strided views of (batch, seq, heads, dim) buffers with unused padding)."""
    b, h, kvh, sq, skv, d, dv = case
    if not strided:
        return {"q": rand(rng, b, h, sq, d), "k": rand(rng, b, kvh, skv, d), "v": rand(rng, b, kvh, skv, dv)}

    def view(heads, seq, dim):  # (b, seq, heads, dim + 3) memory, viewed as (b, heads, seq, dim)
        return rand(rng, b, seq, heads, dim + 3)[..., :dim].transpose(0, 2, 1, 3)

    return {"q": view(h, sq, d), "k": view(kvh, skv, d), "v": view(kvh, skv, dv)}


def _cfg(isa: str, rows: int, kb: int | None = None, threads: int = 2, hero: int = 0):
    h = ATTN_HEROES[isa][hero]
    extra = {} if kb is None else {"kb": kb}
    return config(**h, rows=rows, threads=threads, **extra)


def _run(isa, op, cfg, arrays, out=None, lse=None):
    b, h, sq, dv = op.batch, op.heads, op.seq_q, op.dv
    out = poisoned((b, h, sq, dv)) if out is None else out
    if lse is not None:
        arrays = dict(arrays, lse=lse)
    run_variant(CpuAttentionVariant(ISA_BY_NAME[isa]), op, cfg, arrays, out)
    return out


def _ref(op, arrays):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return ref_kernels.attention(op, arrays["q"], arrays["k"], arrays["v"], arrays.get("mask"))


def _err(out, ref) -> float:
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("driver", ["rows", "tile"])
@pytest.mark.parametrize("causal", [False, True])
def test_drivers_against_reference(isa, driver, causal):
    rng = np.random.default_rng([len(isa), len(driver), int(causal)])
    for case in DECODE + PREFILL:
        op = _op(case, causal=causal)
        cfg = _cfg(isa, rows=1 << 20 if driver == "rows" else 0, kb=64 if case[4] > 64 else None)
        arrays = _arrays(rng, case)
        out = _run(isa, op, cfg, arrays)
        assert _err(out, _ref(op, arrays)) < 1e-5, (isa, driver, case, causal)


@pytest.mark.parametrize("driver", ["rows", "tile"])
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_operands_and_output(driver, threads):
    """q, k, v and the output as (batch, seq, heads, dim) views (timm / Hugging Face layouts), read and
    written in place: the rest of the output buffer is untouched."""
    rng = np.random.default_rng(5)
    for case in DECODE[1:4] + PREFILL[:3]:
        b, h, kvh, sq, skv, d, dv = case
        op = _op(case, causal=sq > 1)
        arrays = _arrays(rng, case, strided=True)
        buf = np.full((b, sq, h, dv + 5), 7.0, dtype=np.float32)
        out = buf[..., 2:2 + dv].transpose(0, 2, 1, 3)
        _run(BEST, op, _cfg(BEST, rows=1 << 20 if driver == "rows" else 0, threads=threads), arrays, out=out)
        assert _err(out, _ref(op, arrays)) < 1e-5, (driver, case)
        assert (buf[..., :2] == 7.0).all() and (buf[..., 2 + dv:] == 7.0).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks_both_drivers(isa, kind):
    rng = np.random.default_rng([len(isa), len(kind), 3])
    for driver in ("rows", "tile"):
        for case, (mb, mh), causal in [(DECODE[2], (1, 8), False), (DECODE[4], (1, 1), True), (DECODE[6], (1, 6), False),
                                       (PREFILL[1], (2, 1), True), (PREFILL[3], (1, 2), False)]:
            b, h, kvh, sq, skv, d, dv = case
            op = _op(case, causal=causal, mask=kind, mask_shape=(mb, mh))
            arrays = _arrays(rng, case)
            if kind == "bool":
                m = (rng.uniform(size=(mb, mh, sq, skv)) < 0.7).astype(np.float32)
                m[..., 0, :] = 0.0  # a fully masked row: weights 0, output 0
            else:
                m = rng.uniform(-3.0, 1.0, size=(mb, mh, sq, skv)).astype(np.float32)
                m[..., -1, :] = -np.inf  # additive -inf everywhere: weights 0 too
            arrays["mask"] = m
            out = _run(isa, op, _cfg(isa, rows=1 << 20 if driver == "rows" else 0, kb=64), arrays)
            ref = _ref(op, arrays)
            assert _err(out, ref) < 1e-5, (isa, kind, driver, case)
            assert (out[:, :, 0 if kind == "bool" else -1, :] == 0.0).all() or causal


@pytest.mark.parametrize("driver", ["rows", "tile"])
def test_log_sum_exp_both_drivers(driver):
    rng = np.random.default_rng(9)
    for case in (DECODE[2], DECODE[4], PREFILL[1]):
        op = _op(case, causal=True, lse=True)
        arrays = _arrays(rng, case)
        lse = np.full((op.batch, op.heads, op.seq_q), np.nan, dtype=np.float32)
        _run(BEST, op, _cfg(BEST, rows=1 << 20 if driver == "rows" else 0, kb=64), arrays, lse=lse)
        q, k = arrays["q"].astype(np.float64), arrays["k"].astype(np.float64)
        k = np.repeat(k, op.heads // int(op.kv_heads), axis=1)
        logits = q @ k.transpose(0, 1, 3, 2) * op.scale
        logits = np.where(np.tril(np.ones((op.seq_q, op.seq_kv), dtype=bool)), logits, -np.inf)
        mx = logits.max(-1, keepdims=True)
        expect = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[..., 0]
        np.testing.assert_allclose(lse, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("driver", ["rows", "tile"])
def test_nonfinite_as_reference(isa, driver):
    rng = np.random.default_rng([len(isa), len(driver), 17])
    for trial in range(12):
        case = (DECODE + PREFILL)[trial % (len(DECODE) + len(PREFILL))]
        causal = bool(trial % 2)
        op = _op(case, causal=causal)
        arrays = _arrays(rng, case)
        name = ("q", "k", "v")[trial % 3]
        inject_nonfinite(rng, arrays[name], 2)
        out = _run(isa, op, _cfg(isa, rows=1 << 20 if driver == "rows" else 0, kb=64), arrays)
        msg = nonfinite_mismatch(out, _ref(op, arrays))
        assert msg is None, f"{isa} {driver} {case} causal={causal} {name}: {msg}"


def test_decode_causal_sees_only_the_first_keys():
    """Top-left causal with one query and many keys (PyTorch's ``is_causal``): query 0 sees key 0 only,
    so its output is v[0] (per kv head); a NaN in a later v still reaches it (weight 0 times NaN)."""
    rng = np.random.default_rng(21)
    case = (1, 4, 2, 1, 50, 32, 32)
    op = _op(case, causal=True)
    arrays = _arrays(rng, case)
    out = _run(BEST, op, _cfg(BEST, rows=8), arrays)
    np.testing.assert_allclose(out[0], np.repeat(arrays["v"][0, :, :1], 2, axis=0), rtol=1e-6)
    arrays["v"][0, 1, 40, 3] = np.nan
    out = _run(BEST, op, _cfg(BEST, rows=8), arrays)
    assert np.isnan(out[0, 2:, 0, 3]).all() and not np.isnan(out[0, :2]).any()


def test_config_params_validated():
    from tracea.doctor.doctor import get_doctor

    v = CpuAttentionVariant(ISA_BY_NAME[BEST])
    prof = get_doctor().profile_for("cpu")
    op = _op(DECODE[1])
    bq, bk = ATTN_HEROES[BEST][0]["bq"], ATTN_HEROES[BEST][0]["bk"]
    assert v.validate_config(op, config(bq=bq, bk=bk), prof)
    assert v.validate_config(op, config(bq=bq, bk=bk, kb=4 * bk, rows=0), prof)
    assert not v.validate_config(op, config(bq=bq, bk=bk, kb=bk + 1), prof)
    assert not v.validate_config(op, config(bq=bq, bk=bk, rows=-1), prof)
    assert not v.validate_config(op, config(bq=bq, bk=bk, kb=True), prof)
    for cfg in v.hero_configs(op, prof):
        assert v.validate_config(op, cfg, prof)
