"""bf16 / fp16 <-> fp32 array casts for the converting 16-bit conv2d: ``tr_bf16_widen`` / ``tr_bf16_round``
(widening is exact: a bf16 is the top half of an fp32 word; rounding to nearest even with NaN kept, made
quiet, and overflow to Inf, torch's rounding: plain loops the compiler vectorises) and, with F16C,
``tr_f16_widen`` / ``tr_f16_round`` (``vcvtph2ps`` / ``vcvtps2ph`` round to nearest even). Split over threads
in 4096-element chunks from 256 Ki elements."""

from __future__ import annotations

#: fp32 bits -> bf16 bits, round to nearest even; NaN stays NaN (made quiet), overflow gives Inf (torch's
#: rounding). Shared by the casts here and the converting bf16 GEMM's output pass (:data:`.f16.BF16C`).
BF16_RNE = r"""
static inline uint16_t tr_f2bf(uint32_t u) {
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""

CAST = r"""
#include <stdint.h>
#include <string.h>
""" + BF16_RNE + r"""

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
            dst[i] = tr_f2bf(u);
        }
    }
}

#if defined(__F16C__)
#include <immintrin.h>
void tr_f16_widen(const uint16_t *src, float *dst, long n, int nth) {
    long chunks = (n + TR_CHUNK - 1) / TR_CHUNK;
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && n >= 262144)
    for (long c = 0; c < chunks; c++) {
        long i = c * TR_CHUNK, i1 = i + TR_CHUNK < n ? i + TR_CHUNK : n;
        for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        for (; i < i1; i++) dst[i] = _cvtsh_ss(src[i]);
    }
}

void tr_f16_round(const float *src, uint16_t *dst, long n, int nth) {
    long chunks = (n + TR_CHUNK - 1) / TR_CHUNK;
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && n >= 262144)
    for (long c = 0; c < chunks; c++) {
        long i = c * TR_CHUNK, i1 = i + TR_CHUNK < n ? i + TR_CHUNK : n;
        for (; i + 8 <= i1; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (; i < i1; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
}
#endif
"""
