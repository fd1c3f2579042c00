#!/usr/bin/env python
"""Tune the thread block of a 5-point Jacobi stencil in CUDA."""

from __future__ import annotations

import numpy as np

KERNEL = r"""
#ifndef WIDTH
#define WIDTH 4096
#define HEIGHT 2048
#endif
__global__ void stencil_kernel(float *x_new, const float *x_old) {
    const int x = blockIdx.x * block_size_x + threadIdx.x;
    const int y = blockIdx.y * block_size_y + threadIdx.y;
    if (x > 0 && y > 0 && x < WIDTH - 1 && y < HEIGHT - 1) {
        const int i = y * WIDTH + x;
        x_new[i] = (x_old[i] + x_old[i - 1] + x_old[i + 1] + x_old[i - WIDTH] + x_old[i + WIDTH]) * 0.2f;
    }
}
"""


def space() -> tuple[dict, list]:
    return {"block_size_x": [32 * i for i in range(1, 9)], "block_size_y": [1, 2, 4, 8, 16, 32]}, []


def tune(tuner, width: int = 4096, height: int = 2048, **options):
    rng = np.random.default_rng()
    old = rng.standard_normal(width * height).astype(np.float32)
    new = old.copy()
    g = old.reshape(height, width).astype(np.float64)
    want = g.copy()
    want[1:-1, 1:-1] = (g[1:-1, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1]) * 0.2
    tune_params, _ = space()
    src = KERNEL.replace("#define WIDTH 4096\n#define HEIGHT 2048", f"#define WIDTH {width}\n#define HEIGHT {height}")
    return tuner.tune_kernel("stencil_kernel", src, (width, height), [new, old], tune_params,
                             grid_div_x=["block_size_x"], grid_div_y=["block_size_y"],
                             answer=[want.astype(np.float32).ravel(), None], atol=1e-5, lang="CUDA", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, *((512, 256) if args.small else (4096, 2048)), strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
