"""The reference backend against independent naive implementations on random shapes (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracea import AttentionOp, Conv2dOp, GemmOp
from tracea.reference import reference

SETTINGS = settings(max_examples=25, deadline=None)
ACTS = {"relu": lambda x: max(x, 0.0), "gelu_erf": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "silu": lambda x: x / (1 + math.exp(-x))}


@SETTINGS
@given(m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(1, 9), batch=st.integers(1, 3),
       ta=st.booleans(), tb=st.booleans(), act=st.sampled_from(sorted(ACTS)), seed=st.integers(0, 2**31))
def test_reference_gemm_matches_loops(m, n, k, batch, ta, tb, act, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, k, m) if ta else (batch, m, k))
    b = rng.standard_normal((batch, n, k) if tb else (batch, k, n))
    bias = rng.standard_normal(n)
    op = GemmOp(m, n, k, batch, trans_a=ta, trans_b=tb, dtype_a="f64", dtype_b="f64", epilogue=f"bias+{act}")
    out = reference(op, a=a, b=b, bias=bias)
    for bi in range(batch):
        for i in range(m):
            for j in range(n):
                s = sum((a[bi, p, i] if ta else a[bi, i, p]) * (b[bi, j, p] if tb else b[bi, p, j]) for p in range(k))
                assert math.isclose(out[bi, i, j], ACTS[act](s + bias[j]), rel_tol=1e-9, abs_tol=1e-9)


def _naive_conv(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    p = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    out = np.zeros((n, k, p, q))
    kg = k // groups
    for ni in range(n):
        for ko in range(k):
            g = ko // kg
            for pi in range(p):
                for qi in range(q):
                    acc = 0.0
                    for ci in range(cg):
                        for ri in range(r):
                            for si in range(s):
                                hi = pi * stride[0] - pad[0] + ri * dil[0]
                                wi = qi * stride[1] - pad[1] + si * dil[1]
                                if 0 <= hi < h and 0 <= wi < wd:
                                    acc += x[ni, g * cg + ci, hi, wi] * w[ko, ci, ri, si]
                    out[ni, ko, pi, qi] = acc
    return out


@SETTINGS
@given(n=st.integers(1, 2), g=st.integers(1, 2), cg=st.integers(1, 3), kg=st.integers(1, 3), h=st.integers(3, 7),
       w=st.integers(3, 7), r=st.integers(1, 3), s=st.integers(1, 3), sh=st.integers(1, 2), sw=st.integers(1, 2),
       ph=st.integers(0, 2), pw=st.integers(0, 1), dh=st.integers(1, 2), nhwc=st.booleans(), seed=st.integers(0, 2**31))
def test_reference_conv_matches_loops(n, g, cg, kg, h, w, r, s, sh, sw, ph, pw, dh, nhwc, seed):
    if h + 2 * ph < dh * (r - 1) + 1 or w + 2 * pw < s:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, g * cg, h, w))
    wt = rng.standard_normal((g * kg, cg, r, s))
    bias = rng.standard_normal(g * kg)
    op = Conv2dOp(n, g * cg, h, w, g * kg, r, s, stride=(sh, sw), padding=(ph, pw), dilation=(dh, 1), groups=g,
                  layout="nhwc" if nhwc else "nchw", dtype="f64", epilogue="bias+silu")
    xin = x.transpose(0, 2, 3, 1) if nhwc else x
    win = wt.transpose(0, 2, 3, 1) if nhwc else wt
    out = reference(op, x=xin, w=win, bias=bias)
    expect = _naive_conv(x, wt, (sh, sw), (ph, pw), (dh, 1), g) + bias[None, :, None, None]
    expect = expect / (1 + np.exp(-expect))
    if nhwc:
        expect = expect.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(out, expect, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(b=st.integers(1, 2), kvh=st.integers(1, 2), rep=st.integers(1, 2), sq=st.integers(1, 6), skv=st.integers(1, 6),
       d=st.integers(1, 5), causal=st.booleans(), seed=st.integers(0, 2**31))
def test_reference_attention_matches_loops(b, kvh, rep, sq, skv, d, causal, seed):
    rng = np.random.default_rng(seed)
    h = kvh * rep
    q = rng.standard_normal((b, h, sq, d))
    k = rng.standard_normal((b, kvh, skv, d))
    v = rng.standard_normal((b, kvh, skv, d))
    op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh, dtype="f64")
    out = reference(op, q=q, k=k, v=v)
    for bi in range(b):
        for hi in range(h):
            kv = hi // rep
            for i in range(sq):
                keys = [j for j in range(skv) if not causal or j <= i]
                if not keys:  # fully masked row: softmax of all -inf is NaN, as in PyTorch
                    assert np.all(np.isnan(out[bi, hi, i]))
                    continue
                logits = np.array([q[bi, hi, i] @ k[bi, kv, j] * op.scale for j in keys])
                p = np.exp(logits - logits.max())
                p /= p.sum()
                expect = sum(pj * v[bi, kv, j] for pj, j in zip(p, keys))
                np.testing.assert_allclose(out[bi, hi, i], expect, rtol=1e-9, atol=1e-12)
