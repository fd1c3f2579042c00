#!/usr/bin/env python
"""Tune a blocked 2D convolution (correlation) written in C: cache blocks, a register tile of outputs per
inner step and unrolling of the filter row; the function times itself."""

from __future__ import annotations

import numpy as np

FILTER = 7

KERNEL = r"""
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

#define FH 7
#define FW 7

/* out[h x w] = sum over (fy, fx) of in[y + fy][x + fx] * filt[fy][fx]; in is (h + FH - 1) x (w + FW - 1) */
extern "C" float conv2d(float *out, const float *in, const float *filt, int w, int h) {
    double t0 = now_ms();
    const int iw = w + FW - 1;
    for (int by = 0; by < h; by += block_y)
    for (int bx = 0; bx < w; bx += block_x) {
        int ye = by + block_y < h ? by + block_y : h;
        int xe = bx + block_x < w ? bx + block_x : w;
        for (int y = by; y < ye; y++) {
            int x = bx;
            for (; x + tile_x <= xe; x += tile_x) {
                float acc[tile_x];
                for (int t = 0; t < tile_x; t++) acc[t] = 0.0f;
                for (int fy = 0; fy < FH; fy++) {
                    const float *row = in + (y + fy) * iw + x;
#if unroll_fx
                    #pragma GCC unroll 8
#else
                    #pragma GCC unroll 1
#endif
                    for (int fx = 0; fx < FW; fx++) {
                        float wv = filt[fy * FW + fx];
                        for (int t = 0; t < tile_x; t++) acc[t] += row[t + fx] * wv;
                    }
                }
                for (int t = 0; t < tile_x; t++) out[y * w + x + t] = acc[t];
            }
            for (; x < xe; x++) {
                float s = 0.0f;
                for (int fy = 0; fy < FH; fy++)
                    for (int fx = 0; fx < FW; fx++) s += in[(y + fy) * iw + x + fx] * filt[fy * FW + fx];
                out[y * w + x] = s;
            }
        }
    }
    return (float)(now_ms() - t0);
}
"""


def space() -> tuple[dict, list]:
    tune_params = {"block_x": [32, 64, 128, 256, 512], "block_y": [1, 2, 4, 8, 16, 32],
                   "tile_x": [1, 2, 4, 8, 16], "unroll_fx": [0, 1]}
    return tune_params, ["tile_x <= block_x"]


def reference(image: np.ndarray, filt: np.ndarray, w: int, h: int) -> np.ndarray:
    """float64 correlation of the padded image with the filter (the kernel's definition)."""
    img = image.reshape(h + FILTER - 1, w + FILTER - 1).astype(np.float64)
    out = np.zeros((h, w))
    for fy in range(FILTER):
        for fx in range(FILTER):
            out += img[fy:fy + h, fx:fx + w] * float(filt[fy * FILTER + fx])
    return out.astype(np.float32).ravel()


def tune(tuner, w: int = 512, h: int = 512, **options):
    rng = np.random.default_rng()
    image = rng.standard_normal((h + FILTER - 1) * (w + FILTER - 1)).astype(np.float32)
    filt = rng.standard_normal(FILTER * FILTER).astype(np.float32)
    out = np.zeros(w * h, np.float32)
    tune_params, restrictions = space()
    answer = [reference(image, filt, w, h), None, None, None, None]
    return tuner.tune_kernel("conv2d", KERNEL, (w, h), [out, image, filt, np.int32(w), np.int32(h)], tune_params,
                             restrictions=restrictions, answer=answer, atol=1e-3,
                             compiler_options=["-O3", "-march=native"], lang="C", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, *((40, 33) if args.small else (512, 512)), strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
