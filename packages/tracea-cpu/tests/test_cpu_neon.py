"""The NEON (AArch64) kernels on a non-Arm machine: every emitted source is cross-compiled with
warnings as errors, and, where qemu user emulation exists, GEMM / conv2d / attention executables run
under it and are compared with the float64 references. Skips with the reason when no cross compiler
(``tracea_cpu.cross``) or no runner is found."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import AttentionOp, Conv2dOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import cross
from tracea_cpu.emit.attention import attention_source
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import NEON
from tracea_cpu.spaces import ATTN_HEROES
from tracea_cpu.testing import attention_ref, conv2d_ref, epilogue_ref, rand, rel_err

CC = cross.find_cross_compiler()
needs_cross = pytest.mark.skipif(isinstance(CC, str), reason=str(CC))
RUNNER = cross.find_runner()
needs_runner = pytest.mark.skipif(
    isinstance(CC, str) or not CC.links or RUNNER is None,
    reason=str(CC) if isinstance(CC, str) else
    "the cross compiler cannot link static executables" if not CC.links else "no qemu-aarch64 (qemu-user) on PATH")

# Reads its integer arguments from argv, float32 operands from stdin, writes the float32 result to stdout.
DRIVER = r"""
#include <stdio.h>
static float *tr_read(long n) {
    float *p = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (n && fread(p, sizeof(float), n, stdin) != (size_t)n) { fprintf(stderr, "short input\n"); exit(3); }
    return p;
}
static float *tr_poisoned(long n) {
    float *p = (float *)malloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) p[i] = NAN;
    return p;
}
int main(int argc, char **argv) {
    long a[32] = {0};
    for (int i = 2; i < argc && i < 34; i++) a[i - 2] = atol(argv[i]);
    float *out; long n_out; int rc;
    if (0) {
#ifdef TR_BLOCKED
    } else if (argv[1][0] == 'g') {          /* batch M N K ta tb bias mc nc kc */
        long bt = a[0], M = a[1], N = a[2], K = a[3];
        float *x = tr_read(bt * M * K), *y = tr_read(bt * K * N), *bias = a[6] ? tr_read(N) : 0;
        n_out = bt * M * N; out = tr_poisoned(n_out);
        rc = tr_gemm(bt, M, N, K, x, a[4] ? 1 : K, a[4] ? M : 1, M * K, y, a[5] ? 1 : N, a[5] ? K : 1, K * N,
                     out, N, M * N, bias, a[7], a[8], a[9], 1);
    } else if (argv[1][0] == 'c') {   /* layout n C H W K R S sh sw ph pw dh dw groups P Q bias mc nc kc indirect */
        long n = a[1], C = a[2], H = a[3], W = a[4], K = a[5], R = a[6], S = a[7], G = a[14], P = a[15], Q = a[16];
        float *x = tr_read(n * C * H * W), *w = tr_read(K * (C / G) * R * S), *bias = a[17] ? tr_read(K) : 0;
        n_out = n * K * P * Q; out = tr_poisoned(n_out);
        rc = tr_conv2d((int)a[0], n, C, H, W, K, R, S, a[8], a[9], a[10], a[11], a[12], a[13], G, P, Q,
                       x, w, bias, out, a[18], a[19], a[20], 1, (int)a[21]);
#else
    } else if (argv[1][0] == 'a') {                          /* B H KVH Sq Skv D causal scale*1e6 */
        long B = a[0], H = a[1], KVH = a[2], Sq = a[3], Skv = a[4], D = a[5];
        float *q = tr_read(B * H * Sq * D), *k = tr_read(B * KVH * Skv * D), *v = tr_read(B * KVH * Skv * D);
        n_out = B * H * Sq * D; out = tr_poisoned(n_out);
        rc = tr_attention(B, H, KVH, Sq, Skv, D, D, (float)(a[7] * 1e-6), (int)a[6], q, k, v, out, 1, 0, 0, 1, 1, 0, 0, 8);
#endif
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    if (rc) { fprintf(stderr, "kernel status %d\n", rc); return 4; }
    fwrite(out, sizeof(float), n_out, stdout);
    return 0;
}
"""

TILES = [(8, 12), (6, 16), (12, 8), (4, 16)]
# Every step in one chain covers all epilogue code; "none" covers the TR_HAS_EPI == 0 paths.
EPILOGUES = ["bias+relu+gelu_tanh+gelu_erf+silu", "none"]


@needs_cross
@pytest.mark.parametrize("tile", TILES)
def test_neon_blocked_sources_compile(tile, tmp_path):
    for epi in EPILOGUES[: 2 if tile == TILES[0] else 1]:
        ok, log = CC.compile(blocked_source(NEON, *tile, Epilogue.parse(epi)), tmp_path / "k.o")
        assert ok, log


@needs_cross
def test_neon_skinny_sources_compile(tmp_path):
    from tracea_cpu.emit.skinny import skinny_source

    for epi in EPILOGUES:
        ok, log = CC.compile(skinny_source(NEON, Epilogue.parse(epi), False), tmp_path / "s.o")
        assert ok, log


@needs_cross
def test_neon_attention_sources_compile(tmp_path):
    for h in ATTN_HEROES["neon"]:
        ok, log = CC.compile(attention_source(NEON, h["bq"], h["bk"]), tmp_path / "a.o")
        assert ok, log


def _exe(tmp_path, source: str, name: str):
    exe = tmp_path / name
    ok, log = CC.compile(("#define TR_BLOCKED\n" if name != "attn" else "") + source + DRIVER, exe, link=True)
    assert ok, log
    return exe


def _run(exe, args, *arrays) -> np.ndarray:
    data = b"".join(np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in arrays if a is not None)
    res = subprocess.run([*RUNNER, str(exe), *map(str, args)], input=data, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return np.frombuffer(res.stdout, dtype=np.float32)


@needs_runner
@pytest.mark.parametrize("tile", [(8, 12), (6, 16)])
def test_neon_gemm_runs_under_qemu(tile, tmp_path):
    rng = np.random.default_rng(5)
    exe = _exe(tmp_path, blocked_source(NEON, *tile, Epilogue.parse("bias+gelu_erf")), "gemm")
    for (m, n, k, bt, ta, tb), (mc, nc, kc) in [((37, 29, 53, 2, 0, 1), (16, 24, 16)),
                                                ((64, 48, 96, 1, 1, 0), (64, 4096, 512)), ((1, 1, 1, 1, 0, 0), (8, 12, 8))]:
        a = rand(rng, bt, *((k, m) if ta else (m, k)))
        b = rand(rng, bt, *((n, k) if tb else (k, n)))
        bias = rand(rng, n)
        out = _run(exe, ["g", bt, m, n, k, ta, tb, 1, mc, nc, kc], a, b, bias).reshape(bt, m, n)
        a64 = a.astype(np.float64).transpose(0, 2, 1) if ta else a.astype(np.float64)
        b64 = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
        ref = epilogue_ref(a64 @ b64, Epilogue.parse("bias+gelu_erf").steps, bias, axis=2)
        assert rel_err(out, ref) < 1e-5, (m, n, k)


@needs_runner
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_neon_conv2d_runs_under_qemu(layout, tmp_path):
    rng = np.random.default_rng(6)
    epi = Epilogue.parse("bias+silu")
    exe = _exe(tmp_path, blocked_source(NEON, 8, 12, epi), "conv")
    cases = [(2, 16, 9, 11, 20, 3, 3, 1, 1, 1, 1), (1, 12, 10, 10, 18, 3, 2, (2, 1), (0, 2), (2, 1), 3)]
    for case in cases:
        n, c, h, w, k, r, s, st, pad, dil, g = case
        op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, groups=g, layout=layout,
                      epilogue=epi)
        x, wt, bias = rand(rng, *op.x_shape), rand(rng, *op.w_shape), rand(rng, k)
        ref = epilogue_ref(conv2d_ref(x, wt, op), epi.steps, bias, axis=1 if layout == "nchw" else 3)
        for indirect in (0, 1, 2):
            args = ["c", 0 if layout == "nchw" else 1, n, c, h, w, k, r, s, *op.stride, *op.padding, *op.dilation,
                    g, op.p, op.q, 1, 16, 24, 40, indirect]
            out = _run(exe, args, x, wt, bias).reshape(op.out_shape)
            assert rel_err(out, ref) < 1e-5, (case, indirect)


@needs_runner
@pytest.mark.parametrize("causal", [False, True])
def test_neon_attention_runs_under_qemu(causal, tmp_path):
    rng = np.random.default_rng(7)
    h = ATTN_HEROES["neon"][0]
    exe = _exe(tmp_path, attention_source(NEON, h["bq"], h["bk"]), "attn")
    # the tile driver, then the rows driver (a few query rows per kv head: decode, odd head dims)
    for b, heads, kvh, sq, skv, d in [(1, 4, 2, 37, 53, 16), (2, 2, 2, 20, 20, 64), (1, 8, 2, 1, 70, 42), (2, 3, 3, 2, 9, 64)]:
        op = AttentionOp(b, heads, sq, skv, d, causal=causal, kv_heads=kvh, scale=0.125)
        q, k, v = rand(rng, b, heads, sq, d), rand(rng, b, kvh, skv, d), rand(rng, b, kvh, skv, d)
        out = _run(exe, ["a", b, heads, kvh, sq, skv, d, int(causal), 125000], q, k, v).reshape(q.shape)
        assert rel_err(out, attention_ref(q, k, v, op)) < 1e-5, (sq, skv, d)


@needs_runner
@pytest.mark.parametrize("epi", ["bias+relu", "gelu_tanh", "bias+gelu_erf", "silu"])
def test_neon_nan_inf_gemm_and_conv_under_qemu(epi, tmp_path):
    """NaN / +-Inf at random positions (docs/architecture.md, "Numerics"): every GEMM driver (blocked,
    GEMV, axpy), every conv algorithm (a corner-tap weight poisoned: 0 * Inf over the zero padding)."""
    rng = np.random.default_rng(len(epi))
    chain = Epilogue.parse(epi)
    exe = _exe(tmp_path, blocked_source(NEON, 8, 12, chain), "gemm")
    for m, n, k, tb in [(37, 29, 53, 0), (3, 40, 64, 1), (2, 40, 30, 0)]:
        a, b, bias = rand(rng, 1, m, k), rand(rng, 1, *((n, k) if tb else (k, n))), rand(rng, n)
        inject_nonfinite(rng, (a, b)[m % 2], 2)
        out = _run(exe, ["g", 1, m, n, k, 0, tb, 1, 16, 24, 16], a, b, bias).reshape(1, m, n)
        b64 = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = epilogue_ref(a.astype(np.float64) @ b64, chain.steps, bias, axis=2)
        assert nonfinite_mismatch(out, ref) is None, (m, n, k, nonfinite_mismatch(out, ref))
    for layout in ("nchw", "nhwc"):
        op = Conv2dOp(1, 16, 7, 9, 20, 3, 3, padding=1, layout=layout, epilogue=chain)
        x, wt, bias = rand(rng, *op.x_shape), rand(rng, *op.w_shape), rand(rng, 20)
        inject_nonfinite(rng, x, 1)
        wt[4, 0, 0, 0] = np.inf
        with np.errstate(invalid="ignore", over="ignore"):
            ref = epilogue_ref(conv2d_ref(x, wt, op), chain.steps, bias, axis=1 if layout == "nchw" else 3)
        for indirect in (0, 1, 2):
            args = ["c", 0 if layout == "nchw" else 1, 1, 16, 7, 9, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, op.p, op.q, 1, 16,
                    24, 40, indirect]
            out = _run(exe, args, x, wt, bias).reshape(op.out_shape)
            assert nonfinite_mismatch(out, ref) is None, (layout, indirect, nonfinite_mismatch(out, ref))


@needs_runner
@pytest.mark.parametrize("causal", [False, True])
def test_neon_nan_inf_attention_under_qemu(causal, tmp_path):
    rng = np.random.default_rng(8 + causal)
    h = ATTN_HEROES["neon"][0]
    exe = _exe(tmp_path, attention_source(NEON, h["bq"], h["bk"]), "attn")
    for trial in range(6):
        b, heads, kvh, sq, skv, d = 1, 4, 2, 37, 53, 16
        op = AttentionOp(b, heads, sq, skv, d, causal=causal, kv_heads=kvh, scale=0.125)
        q, k, v = rand(rng, b, heads, sq, d), rand(rng, b, kvh, skv, d), rand(rng, b, kvh, skv, d)
        inject_nonfinite(rng, (q, k, v)[trial % 3], 1)
        out = _run(exe, ["a", b, heads, kvh, sq, skv, d, int(causal), 125000], q, k, v).reshape(q.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = attention_ref(q, k, v, op)
        assert nonfinite_mismatch(out, ref) is None, (trial, nonfinite_mismatch(out, ref))
