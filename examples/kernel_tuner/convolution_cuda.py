#!/usr/bin/env python
"""Tune a 2D convolution (correlation) in CUDA with the filter in constant memory (``cmem_args``)."""

from __future__ import annotations

import numpy as np

FH = FW = 15

KERNEL = r"""
#ifndef W
#define W 4096
#define H 4096
#endif
#define FH 15
#define FW 15
#define IN_W (W + FW - 1)
#define TILE_W (block_size_x * tile_size_x)
#define TILE_H (block_size_y * tile_size_y)
#if use_padding
#define SH_W (TILE_W + FW - 1 + 1)
#else
#define SH_W (TILE_W + FW - 1)
#endif

__constant__ float d_filter[FH * FW];

/* out[y][x] = sum_{i,j} in[y + i][x + j] * filter[i][j]; the input is (H + FH - 1) x (W + FW - 1).
   Each block stages its input window in shared memory; every thread computes tile_size_y x tile_size_x
   outputs strided by the block size. */
__global__ void convolution_kernel(float *out, const float *in, const float *filter) {
    __shared__ float window[TILE_H + FH - 1][SH_W];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int bx = blockIdx.x * TILE_W, by = blockIdx.y * TILE_H;
    for (int r = ty; r < TILE_H + FH - 1; r += block_size_y)
        for (int c = tx; c < TILE_W + FW - 1; c += block_size_x) {
            const int gy = by + r, gx = bx + c;
            float v = 0.0f;
            if (gy < H + FH - 1 && gx < IN_W) {
                v = __ldg(&in[gy * IN_W + gx]);
            }
            window[r][c] = v;
        }
    __syncthreads();
    float acc[tile_size_y][tile_size_x] = {};
    for (int i = 0; i < FH; i++)
        for (int j = 0; j < FW; j++) {
            const float f = d_filter[i * FW + j];
            #pragma unroll
            for (int ti = 0; ti < tile_size_y; ti++)
                #pragma unroll
                for (int tj = 0; tj < tile_size_x; tj++)
                    acc[ti][tj] += window[ty + ti * block_size_y + i][tx + tj * block_size_x + j] * f;
        }
    #pragma unroll
    for (int ti = 0; ti < tile_size_y; ti++)
        #pragma unroll
        for (int tj = 0; tj < tile_size_x; tj++) {
            const int y = by + ty + ti * block_size_y, x = bx + tx + tj * block_size_x;
            if (y < H && x < W) out[y * W + x] = acc[ti][tj];
        }
}
"""


def space() -> tuple[dict, list]:
    tune_params = {"block_size_x": [16, 32, 48, 64, 128], "block_size_y": [1, 2, 4, 8, 16],
                   "tile_size_x": [1, 2, 4], "tile_size_y": [1, 2, 4], "use_padding": [0, 1]}
    # padding only where it can change bank conflicts; the staged window must fit 48 KB of shared memory
    return tune_params, ["use_padding == 0 or block_size_x % 32 != 0",
                         "(block_size_y * tile_size_y + 14) * (block_size_x * tile_size_x + 15) * 4 <= 48 * 1024"]


def reference(inp: np.ndarray, filt: np.ndarray, h: int, w: int) -> np.ndarray:
    """float64 correlation through the FFT (exact to ~1e-12 here, and fast for 4096^2 images)."""
    img = inp.reshape(h + FH - 1, w + FW - 1).astype(np.float64)
    f = np.zeros_like(img)
    f[:FH, :FW] = filt.reshape(FH, FW)
    full = np.fft.irfft2(np.fft.rfft2(img) * np.conj(np.fft.rfft2(f)), s=img.shape)
    return full[:h, :w].astype(np.float32).ravel()


def problem(h: int = 4096, w: int = 4096):
    rng = np.random.default_rng()
    inp = rng.standard_normal((h + FH - 1) * (w + FW - 1)).astype(np.float32)
    filt = rng.standard_normal(FH * FW).astype(np.float32)
    out = np.zeros(h * w, np.float32)
    return [out, inp, filt], [reference(inp, filt, h, w), None, None], {"d_filter": filt}


def source(h: int, w: int) -> str:
    return KERNEL.replace("#define W 4096\n#define H 4096", f"#define W {w}\n#define H {h}")


def tune(tuner, h: int = 4096, w: int = 4096, **options):
    args, answer, cmem = problem(h, w)
    tune_params, restrictions = space()
    return tuner.tune_kernel("convolution_kernel", source(h, w), (w, h), args, tune_params,
                             grid_div_x=["block_size_x", "tile_size_x"], grid_div_y=["block_size_y", "tile_size_y"],
                             restrictions=restrictions, cmem_args=cmem, answer=answer, atol=1e-3, lang="CUDA",
                             **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    n = 512 if args.small else 4096
    results, env = tune(tuner, n, n, strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
