#!/usr/bin/env python
"""Tune an OpenMP + vector-extension vector add written in C (the C function returns its time in ms)."""

from __future__ import annotations

import numpy as np

KERNEL = r"""
#include <omp.h>

typedef float vec_t __attribute__ ((vector_size (vecsize * sizeof(float))));

extern "C" float vector_add(vec_t *c, const vec_t *a, const vec_t *b, int n) {
    double t0 = omp_get_wtime();
    int nvec = n / vecsize;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int i = 0; i < nvec; i++)
        c[i] = a[i] + b[i];
    return (float)((omp_get_wtime() - t0) * 1e3);
}
"""


def space() -> tuple[dict, list]:
    return {"nthreads": [1, 2, 4], "vecsize": [1, 2, 4, 8, 16]}, []


def tune(tuner, size: int = 4 * 1024 * 1024, **options):
    """Tune with ``tuner`` (the kernel_tuner or tracea module); returns (results, env)."""
    rng = np.random.default_rng()
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    c = np.zeros_like(a)
    tune_params, _ = space()
    answer = [a + b, None, None, None]
    return tuner.tune_kernel("vector_add", KERNEL, size, [c, a, b, np.int32(size)], tune_params, answer=answer,
                             compiler_options=["-O3", "-fopenmp"], lang="C", **options)


if __name__ == "__main__":
    from _common import tuner_from_args

    tuner, args = tuner_from_args(__doc__)
    results, env = tune(tuner, size=1 << 16 if args.small else 16 << 20, strategy=args.strategy)
    print(f"{len(results)} configs on {env['device_name']}")
