"""CUDA C++ fragments shared by every emitted kernel: PTX wrappers, dtype conversions, epilogues.

Kernels are rendered without any ``#include`` so the same source compiles with NVRTC (through CuPy)
and with ``nvcc`` offline. 16-bit values travel as ``unsigned short`` bit patterns and are converted
with ``cvt`` instructions.
"""

from __future__ import annotations

from tracea.dtypes import DType
from tracea.errors import DTypeError
from tracea.ir.epilogue import Epilogue, EpilogueKind

#: C storage type of each dtype in emitted code.
CTYPE = {DType.F32: "float", DType.F16: "unsigned short", DType.BF16: "unsigned short"}

PRELUDE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

static __device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
static __device__ __forceinline__ float f16_to_f32(u16 x) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f;
}
static __device__ __forceinline__ float bf16_to_f32(u16 x) { return __uint_as_float(((u32)x) << 16); }
static __device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
static __device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
static __device__ __forceinline__ u32 f32_to_tf32(float f) {
    u32 r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f)); return r;
}
static __device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
static __device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// max(a, b) that returns NaN when either is NaN (fmaxf returns the other operand): ReLU and clamps
// must let NaN through, as PyTorch does. One FMNMX.NAN on sm_80+ (PTX max.NaN), else compare + select.
static __device__ __forceinline__ float max_nan_f(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
#else
    return (a != a || a > b) ? a : b;
#endif
}
static __device__ __forceinline__ float relu_f(float x) { return max_nan_f(x, 0.0f); }
static __device__ __forceinline__ float gelu_tanh_f(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
static __device__ __forceinline__ float tanh_fast(float x) {
    float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
// 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) in 5 FP32 ops + one MUFU.
static __device__ __forceinline__ float gelu_tanh_fast(float x) {
    const float hx = 0.5f * x;
    const float u = x * fmaf(0.035677408136300125f, x * x, 0.7978845608028654f);
    return fmaf(hx, tanh_fast(u), hx);
}
// GELU(tanh) of x given h = x / 2 (callers fold the halving into a preceding FMA):
// h + h tanh(h (2k + 8kc h^2)), k = sqrt(2/pi), c = 0.044715.
static __device__ __forceinline__ float gelu_tanh_half(float h) {
    return fmaf(h, tanh_fast(h * fmaf(0.285419265090401f, h * h, 1.5957691216057308f)), h);
}
static __device__ __forceinline__ float gelu_erf_f(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
"""

_LOAD = {DType.F32: "({v})", DType.F16: "f16_to_f32({v})", DType.BF16: "bf16_to_f32({v})"}
_STORE = {DType.F32: "({v})", DType.F16: "f32_to_f16({v})", DType.BF16: "f32_to_bf16({v})"}

# NaN and Inf as PyTorch (docs/architecture.md, "Numerics"): relu_f keeps NaN (fmaxf would drop it);
# the GELU / SiLU formulas give +inf at +inf and NaN at -inf (-inf * 0, -inf / inf) like torch's.
_ACT = {EpilogueKind.RELU: "relu_f({v})", EpilogueKind.GELU_TANH: "gelu_tanh_f({v})",
        EpilogueKind.GELU_ERF: "gelu_erf_f({v})", EpilogueKind.SILU: "silu_f({v})"}


def ctype(dtype: DType) -> str:
    """The C type that stores ``dtype`` in emitted kernels."""
    try:
        return CTYPE[dtype.storage]
    except KeyError:
        raise DTypeError("dtype", dtype.value, "float32, float16 or bfloat16 for CUDA kernels") from None


def load_expr(dtype: DType, value: str) -> str:
    """C expression converting a stored ``dtype`` value to float."""
    return _LOAD[dtype.storage].format(v=value)


def store_expr(dtype: DType, value: str) -> str:
    """C expression converting a float to the storage type of ``dtype``."""
    return _STORE[dtype.storage].format(v=value)


def epilogue_function(epilogue: Epilogue, bias_dtype: DType, out_dtype: DType = DType.F32) -> str:
    """``apply_epilogue(v, bias, col)``: the epilogue chain on one accumulator value, in registers.

    The bias is per output column (GEMM) or per output channel (conv); ``col`` indexes it. For 16-bit
    outputs GELU(tanh) uses the hardware ``tanh.approx`` (relative error ~2^-11, below the output's
    own rounding); float32 outputs keep the accurate ``tanhf``.
    """
    bt = ctype(bias_dtype)
    load = load_expr(bias_dtype, '__ldg(bias + col)' if bias_dtype is DType.F32 else 'bias[col]')
    lines = [f"static __device__ __forceinline__ float bias_at(const {bt}* __restrict__ bias, int col) {{",
             f"    return {load if epilogue.has_bias else '0.0f'};", "}",
             "// The chain with the column's bias already loaded (kernels hoist it out of row loops).",
             "static __device__ __forceinline__ float apply_epilogue_b(float v, float b) {"]
    for step in epilogue:
        if step is EpilogueKind.BIAS:
            lines.append("    v += b;")
        else:
            expr = _ACT[step]
            if step is EpilogueKind.GELU_TANH and out_dtype.storage is not DType.F32:
                expr = "gelu_tanh_fast({v})"
            lines.append(f"    v = {expr.format(v='v')};")
    lines.append("    return v;\n}")
    lines.append(f"static __device__ __forceinline__ float apply_epilogue(float v, const {bt}* __restrict__ bias, "
                 "int col) {\n    return apply_epilogue_b(v, bias_at(bias, col));\n}")
    return "\n".join(lines)



def pair_epilogue_function(epilogue: Epilogue, out_dtype: DType) -> tuple[str, float] | None:
    """``epi_pair(a0, a1, b0, b1)``: a GELU(tanh) chain (with or without a leading bias) on two accumulators
    of one row, returned as one packed 16-bit pair; None for other chains or outputs.

    Returns (C source, the scale of the bias values the caller passes). GELU's 0.5 and the bias fold into
    one FMA when the caller passes bias / 2: h = a/2 + b/2, then ``gelu_tanh_half(h)`` -- 5 FP32 ops and
    one MUFU per value. The MUFU (16 tanh per clock per SM
    on an H200, ``tanh.approx.f16x2`` included) bounds this epilogue; the FP32 count only trims it.
    """
    storage = out_dtype.storage
    if storage not in (DType.F16, DType.BF16):
        return None
    if tuple(epilogue) not in ((EpilogueKind.GELU_TANH,), (EpilogueKind.BIAS, EpilogueKind.GELU_TANH)):
        return None
    suffix = "f16x2" if storage is DType.F16 else "bf16x2"
    src = (f"static __device__ __forceinline__ u32 epi_pair(float a0, float a1, float b0, float b1) {{\n"
           f"    const float o0 = gelu_tanh_half(fmaf(a0, 0.5f, b0)), o1 = gelu_tanh_half(fmaf(a1, 0.5f, b1));\n"
           f"    u32 r; asm(\"cvt.rn.{suffix}.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(o1), \"f\"(o0)); return r;\n}}\n")
    return src, 0.5
