"""bf16 <-> fp32 array casts (``tr_bf16_widen``, ``tr_bf16_round``) for the converting bf16 conv2d: widening
is exact (a bf16 is the top half of an fp32 word); rounding is to nearest even with NaN kept (made quiet)
and overflow to Inf, torch's rounding. Plain loops the compiler vectorises, split over threads in 4096-element
chunks from 256 Ki elements."""

from __future__ import annotations

CAST = r"""
#include <stdint.h>
#include <string.h>

#define TR_CHUNK 4096L

void tr_bf16_widen(const uint16_t *src, float *dst, long n, int nth) {
    long chunks = (n + TR_CHUNK - 1) / TR_CHUNK;
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && n >= 262144)
    for (long c = 0; c < chunks; c++) {
        long i1 = c * TR_CHUNK + TR_CHUNK < n ? c * TR_CHUNK + TR_CHUNK : n;
        for (long i = c * TR_CHUNK; i < i1; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(dst + i, &u, 4);
        }
    }
}

void tr_bf16_round(const float *src, uint16_t *dst, long n, int nth) {
    long chunks = (n + TR_CHUNK - 1) / TR_CHUNK;
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && n >= 262144)
    for (long c = 0; c < chunks; c++) {
        long i1 = c * TR_CHUNK + TR_CHUNK < n ? c * TR_CHUNK + TR_CHUNK : n;
        for (long i = c * TR_CHUNK; i < i1; i++) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            dst[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)r;
        }
    }
}
"""
