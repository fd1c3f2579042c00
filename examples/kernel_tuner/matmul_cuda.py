#!/usr/bin/env python
"""Tune a shared-memory tiled SGEMM in CUDA: thread block shape, work per thread, padding, __ldg."""

from __future__ import annotations

import numpy as np

KERNEL = r"""
#ifndef N
#define N 2048
#endif
#if pad
#define LDA (block_size_x + 1)
#else
#define LDA block_size_x
#endif

/* C = A * B (N x N, row-major). A block of block_size_x x block_size_y threads owns a
   (block_size_y * tile_size_y) x (block_size_x * tile_size_x) tile of C; every thread accumulates
   tile_size_y x tile_size_x values. Requires block_size_x == block_size_y * tile_size_y, so the A and
   B tiles staged per step are block_size_x deep. */
__global__ void matmul_kernel(float *C, const float *A, const float *B) {
    __shared__ float a_tile[block_size_x][LDA];
    __shared__ float b_tile[block_size_x][block_size_x * tile_size_x];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col0 = blockIdx.x * block_size_x * tile_size_x + tx;
    const int row0 = blockIdx.y * block_size_y * tile_size_y + ty;
    float acc[tile_size_y][tile_size_x] = {};

    for (int k0 = 0; k0 < N; k0 += block_size_x) {
        #pragma unroll
        for (int i = 0; i < tile_size_y; i++) {
            const int r = ty + i * block_size_y;
#if read_only
            a_tile[r][tx] = __ldg(&A[(row0 + i * block_size_y) * N + k0 + tx]);
#else
            a_tile[r][tx] = A[(row0 + i * block_size_y) * N + k0 + tx];
#endif
            #pragma unroll
            for (int j = 0; j < tile_size_x; j++) {
#if read_only
                b_tile[r][tx + j * block_size_x] = __ldg(&B[(k0 + r) * N + col0 + j * block_size_x]);
#else
                b_tile[r][tx + j * block_size_x] = B[(k0 + r) * N + col0 + j * block_size_x];
#endif
            }
        }
        __syncthreads();
        #pragma unroll 8
        for (int k = 0; k < block_size_x; k++) {
            #pragma unroll
            for (int i = 0; i < tile_size_y; i++) {
                const float a = a_tile[ty + i * block_size_y][k];
                #pragma unroll
                for (int j = 0; j < tile_size_x; j++)
                    acc[i][j] += a * b_tile[k][tx + j * block_size_x];
            }
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < tile_size_y; i++)
        #pragma unroll
        for (int j = 0; j < tile_size_x; j++)
            C[(row0 + i * block_size_y) * N + col0 + j * block_size_x] = acc[i][j];
}
"""


def space() -> tuple[dict, list]:
    tune_params = {"block_size_x": [16, 32, 64, 128], "block_size_y": [1, 2, 4, 8, 16, 32],
                   "tile_size_x": [1, 2, 4, 8], "tile_size_y": [1, 2, 4, 8], "pad": [0, 1], "read_only": [0, 1]}
    return tune_params, ["block_size_x == block_size_y * tile_size_y"]


def problem(n: int = 2048):
    rng = np.random.default_rng()
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.zeros_like(a)
    answer = [(a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32), None, None]
    return [c, a, b], answer


def tune(tuner, n: int = 2048, **options):
    args, answer = problem(n)
    tune_params, restrictions = space()
    return tuner.tune_kernel("matmul_kernel", KERNEL.replace("#define N 2048", f"#define N {n}"), (n, n), args,
                             tune_params, grid_div_x=["block_size_x", "tile_size_x"],
                             grid_div_y=["block_size_y", "tile_size_y"], restrictions=restrictions,
                             answer=answer, atol=1e-2, lang="CUDA", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, n=512 if args.small else 2048, strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
