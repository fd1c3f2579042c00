#!/usr/bin/env python
"""Tune a cache-blocked C matrix multiply (block sizes, unrolling); the function times itself."""

from __future__ import annotations

import numpy as np

KERNEL = r"""
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* C[n x n] = A[n x n] * B[n x n], row-major, blocked i/j/k, inner j loop unrolled by `unroll` */
extern "C" float matmul(float *C, const float *A, const float *B, int n) {
    double t0 = now_ms();
    for (int i = 0; i < n * n; i++) C[i] = 0.0f;
    for (int ii = 0; ii < n; ii += block_i)
    for (int kk = 0; kk < n; kk += block_k)
    for (int jj = 0; jj < n; jj += block_j) {
        int ie = ii + block_i < n ? ii + block_i : n;
        int ke = kk + block_k < n ? kk + block_k : n;
        int je = jj + block_j < n ? jj + block_j : n;
        for (int i = ii; i < ie; i++)
        for (int k = kk; k < ke; k++) {
            float a = A[i * n + k];
            const float *b = B + k * n;
            float *c = C + i * n;
            int j = jj;
            for (; j + unroll <= je; j += unroll) {
                #pragma GCC unroll 16
                for (int u = 0; u < unroll; u++) c[j + u] += a * b[j + u];
            }
            for (; j < je; j++) c[j] += a * b[j];
        }
    }
    return (float)(now_ms() - t0);
}
"""


def space() -> tuple[dict, list]:
    tune_params = {"block_i": [8, 16, 32, 64], "block_j": [32, 64, 128, 256], "block_k": [16, 32, 64, 128, 256],
                   "unroll": [1, 4, 8, 16]}
    return tune_params, ["unroll <= block_j"]


def tune(tuner, n: int = 256, **options):
    rng = np.random.default_rng()
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.zeros_like(a)
    tune_params, restrictions = space()
    answer = [(a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32), None, None, None]
    return tuner.tune_kernel("matmul", KERNEL, (n, n), [c, a, b, np.int32(n)], tune_params, restrictions=restrictions,
                             answer=answer, atol=1e-3, compiler_options=["-O3", "-march=native"], lang="C", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, n=64 if args.small else 256, strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
