#!/usr/bin/env python
"""Tune a tiled 5-point Jacobi stencil written in C, two sweeps per call (tile sizes, inner unrolling,
non-temporal hint); the function times itself."""

from __future__ import annotations

import numpy as np

KERNEL = r"""
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n) PRAGMA_(GCC unroll n)

static void sweep(float *__restrict__ dst, const float *__restrict__ src, int w, int h) {
    for (int jj = 1; jj < h - 1; jj += tile_y)
    for (int ii = 1; ii < w - 1; ii += tile_x) {
        int je = jj + tile_y < h - 1 ? jj + tile_y : h - 1;
        int ie = ii + tile_x < w - 1 ? ii + tile_x : w - 1;
        for (int j = jj; j < je; j++) {
            const float *c = src + j * w;
            float *d = dst + j * w;
            UNROLL(unroll)
            for (int i = ii; i < ie; i++)
                d[i] = 0.2f * (c[i] + c[i - 1] + c[i + 1] + c[i - w] + c[i + w]);
        }
    }
}

/* two Jacobi sweeps: tmp = S(in), out = S(tmp); borders copied from in */
extern "C" float stencil(float *out, const float *in, float *tmp, int w, int h) {
    double t0 = now_ms();
    for (int i = 0; i < w * h; i++) { tmp[i] = in[i]; out[i] = in[i]; }
    sweep(tmp, in, w, h);
    sweep(out, tmp, w, h);
    return (float)(now_ms() - t0);
}
"""


def space() -> tuple[dict, list]:
    tune_params = {"tile_x": [16, 32, 64, 128, 256, 512, 1024, 2048], "tile_y": [1, 2, 4, 8, 16, 32, 64, 128],
                   "unroll": [1, 2, 4, 8]}
    return tune_params, ["tile_x * tile_y >= 64"]


def reference(x: np.ndarray, w: int, h: int) -> np.ndarray:
    g = x.reshape(h, w).astype(np.float64)
    for _ in range(2):
        n = g.copy()
        n[1:-1, 1:-1] = 0.2 * (g[1:-1, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1])
        g = n
    return g.astype(np.float32).ravel()


def tune(tuner, w: int = 2048, h: int = 1024, **options):
    rng = np.random.default_rng()
    x = rng.standard_normal(w * h).astype(np.float32)
    out = np.zeros_like(x)
    tmp = np.zeros_like(x)
    tune_params, restrictions = space()
    answer = [reference(x, w, h), None, None, None, None]
    return tuner.tune_kernel("stencil", KERNEL, (w, h), [out, x, tmp, np.int32(w), np.int32(h)], tune_params,
                             restrictions=restrictions, answer=answer, atol=1e-4,
                             compiler_options=["-O3", "-march=native"], lang="C", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, *((67, 45) if args.small else (2048, 1024)), strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
