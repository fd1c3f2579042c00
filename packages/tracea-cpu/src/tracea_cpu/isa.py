"""Instruction sets the CPU backend emits code for, as data: compiler flags, the host flags a variant
requires, the vector width, the micro-kernel shapes that fit the register file, and the C macro layer
(``V*`` macros) that the emitters write all vector code against."""

from __future__ import annotations

import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Isa:
    """One SIMD instruction set.

    :param name: short name used in variant names (``avx512``, ``avx2``, ``neon``, ``scalar``).
    :param cflags: compiler flags that enable it.
    :param requires: host profile ISA flags that must all be present.
    :param width: fp32 lanes per vector register.
    :param registers: architectural vector registers (bounds the micro-tile).
    :param tiles: (mr, nr) register tiles offered to the tuner, best first.
    :param prelude: C text defining the ``V*`` macro layer. ``VMAX(a, b)`` / ``VMIN(a, b)`` return ``b``
        when either operand is NaN on x86 and in the scalar layer (NEON returns NaN): code that must
        carry a NaN through puts that value second. ``VANYNAN(a)``: whether any lane is NaN.
    :param machines: ``platform.machine()`` values this ISA can run on.
    """

    name: str
    cflags: tuple[str, ...]
    requires: tuple[str, ...]
    width: int
    registers: int
    tiles: tuple[tuple[int, int], ...]
    prelude: str
    machines: tuple[str, ...]

    def fits(self, mr: int, nr: int) -> bool:
        """Whether an mr x nr accumulator tile plus its B vectors and one broadcast fit the registers."""
        if nr % self.width:
            return False
        acc = mr * (nr // self.width)
        return acc + nr // self.width + 1 <= self.registers

    def runs_here(self) -> bool:
        m = platform.machine().lower()
        return not self.machines or m in self.machines


_X86 = ("x86_64", "amd64", "i686", "i386")
_ARM = ("aarch64", "arm64")

_AVX512 = r"""
#include <immintrin.h>
typedef __m512 V;
typedef __m512i VI;
#define VW 16
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VROUND(a) _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VABS(a) _mm512_abs_ps(a)
#define VSIGNBITS(a) _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000))
#define VORBITS(a, s) _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), s))
#define VHMAX(a) _mm512_reduce_max_ps(a)
#define VHSUM(a) _mm512_reduce_add_ps(a)
#define VANYNAN(a) (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0)
#define VPREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
"""

_AVX2 = r"""
#include <immintrin.h>
typedef __m256 V;
typedef __m256i VI;
#define VW 8
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VROUND(a) _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define VABS(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a)
#define VSIGNBITS(a) _mm256_and_si256(_mm256_castps_si256(a), _mm256_set1_epi32((int)0x80000000))
#define VORBITS(a, s) _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(a), s))
static inline float tr_hmax(__m256 a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline float tr_hsum(__m256 a) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
#define VHMAX(a) tr_hmax(a)
#define VHSUM(a) tr_hsum(a)
#define VANYNAN(a) (_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0)
#define VPREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
"""

_NEON = r"""
#include <arm_neon.h>
typedef float32x4_t V;
typedef uint32x4_t VI;
#define VW 4
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32((p), (v))
#define VSET1(x) vdupq_n_f32(x)
#define VZERO() vdupq_n_f32(0.0f)
#define VADD(a, b) vaddq_f32(a, b)
#define VSUB(a, b) vsubq_f32(a, b)
#define VMUL(a, b) vmulq_f32(a, b)
#define VDIV(a, b) vdivq_f32(a, b)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VMAX(a, b) vmaxq_f32(a, b)
#define VMIN(a, b) vminq_f32(a, b)
#define VROUND(a) vrndnq_f32(a)
#define VPOW2I(n) vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23))
#define VABS(a) vabsq_f32(a)
#define VSIGNBITS(a) vandq_u32(vreinterpretq_u32_f32(a), vdupq_n_u32(0x80000000u))
#define VORBITS(a, s) vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(a), s))
#define VHMAX(a) vmaxvq_f32(a)
#define VHSUM(a) vaddvq_f32(a)
#define VANYNAN(a) (vminvq_u32(vceqq_f32(a, a)) == 0)
#define VPREFETCH(p) __builtin_prefetch((p))
"""

_SCALAR = r"""
#include <string.h>
#include <math.h>
typedef float V;
typedef unsigned int VI;
#define VW 1
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VSET1(x) ((float)(x))
#define VZERO() 0.0f
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VDIV(a, b) ((a) / (b))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VMAX(a, b) ((a) > (b) ? (a) : (b))
#define VMIN(a, b) ((a) < (b) ? (a) : (b))
#define VROUND(a) nearbyintf(a)
static inline float tr_pow2i(float n) { unsigned int u = (unsigned int)((int)n + 127) << 23; float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int tr_signbits(float a) { unsigned int u; memcpy(&u, &a, 4); return u & 0x80000000u; }
static inline float tr_orbits(float a, unsigned int s) { unsigned int u; memcpy(&u, &a, 4); u |= s; memcpy(&a, &u, 4); return a; }
#define VPOW2I(n) tr_pow2i(n)
#define VABS(a) fabsf(a)
#define VSIGNBITS(a) tr_signbits(a)
#define VORBITS(a, s) tr_orbits(a, s)
#define VHMAX(a) (a)
#define VHSUM(a) (a)
#define VANYNAN(a) ((a) != (a))
#define VPREFETCH(p) __builtin_prefetch((p))
"""

AVX512 = Isa("avx512", ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mavx2"),
             ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"), 16, 32,
             ((14, 32), (6, 64), (8, 48), (12, 32), (10, 32), (4, 64), (7, 32)), _AVX512, _X86)
AVX2 = Isa("avx2", ("-mavx2", "-mfma"), ("avx2", "fma"), 8, 16,
           ((6, 16), (4, 24), (5, 16), (3, 32)), _AVX2, _X86)
NEON = Isa("neon", (), ("neon",), 4, 32, ((8, 12), (6, 16), (12, 8), (4, 16)), _NEON, _ARM)
SCALAR = Isa("scalar", (), (), 1, 64, ((4, 4), (4, 8), (2, 4)), _SCALAR, ())

ALL_ISAS = (AVX512, AVX2, NEON, SCALAR)
ISA_BY_NAME = {i.name: i for i in ALL_ISAS}
# bf16 GEMM only (``vdpbf16ps``): the AVX-512 layer plus AVX512_BF16. Not in ALL_ISAS, which lists the
# ISAs every fp32 op is emitted for.
AVX512_BF16 = Isa("avx512bf16", AVX512.cflags + ("-mavx512bf16",), AVX512.requires + ("avx512_bf16",), 16, 32,
                  ((6, 64), (14, 32), (8, 48), (12, 32), (4, 64)), _AVX512, _X86)
# bf16 GEMM on AMX tiles (``tdpbf16ps``): the AVX512_BF16 layer (packing, epilogue, bf16 stores) plus
# AMX-TILE and AMX-BF16. ``tiles``: MR x NR blocks of 16 x 16 accumulator tiles (not vector registers).
AMX_BF16 = Isa("amxbf16", AVX512_BF16.cflags + ("-mamx-tile", "-mamx-bf16"),
               AVX512_BF16.requires + ("amx_tile", "amx_bf16"), 16, 8,
               ((32, 32), (16, 64), (16, 32)), _AVX512, _X86)
# int8 linear layers on CPUs with AVX512-VNNI but no usable AMX (Ice Lake, Zen 4 / Zen 5): the VNNI
# kernel (``vpdpbusd``) for every token count.
AVX512_VNNI = Isa("avx512vnni", AVX512.cflags + ("-mavx512vnni",), AVX512.requires + ("avx512_vnni",), 16, 32,
                  ((1, 16),), _AVX512, _X86)
# int8 linear layers on AMX tiles (``tdpbssd``): the AVX-512 layer plus AMX-TILE and AMX-INT8, and
# AVX512-VNNI (``vpdpbusd``, every AMX CPU has it) for the few-tokens kernel.
AMX_INT8 = Isa("amxint8", AVX512.cflags + ("-mavx512vnni", "-mamx-tile", "-mamx-int8"),
               AVX512.requires + ("avx512_vnni", "amx_tile", "amx_int8"),
               16, 8, ((32, 32),), _AVX512, _X86)
