"""C text shared by every emitted kernel: includes, the vectorised math functions (exp, tanh, erf)
written once against the ISA's ``V*`` macro layer, the epilogue chain, and a reusable workspace."""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue, EpilogueKind

from ..isa import Isa

HEADER = r"""
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#define TR_TID() omp_get_thread_num()
#define TR_NT() omp_get_num_threads()
#else
#define TR_TID() 0
#define TR_NT() 1
#endif
#define TR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TR_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TR_ROUNDUP(a, b) (((a) + (b) - 1) / (b) * (b))
#define TR_ALIGN 64
#include <time.h>
#include <sched.h>
static inline long tr_now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec;
}
static inline void tr_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
#ifndef TR_JOIN_SPIN
#define TR_JOIN_SPIN 1
#endif
/* The end of a thread's share of a parallel region (call it last in the region, then let the region
   end): counts the thread done; the calling thread (tid 0) then spins until all T are done, for at most
   max(20 us, 1/8 of the time since t_call), so that it reaches the region's closing barrier last instead
   of sleeping in it. A sleeping master is woken by the last worker through the kernel (on the 2-core
   KVM development VM: ~45 us after that worker finished, the core being halted); spinning is bounded so
   a descheduled worker on a busy host costs at most that fraction of the call. */
static inline void tr_join(int *done, int T, int tid, long t_call) {
    __atomic_add_fetch(done, 1, __ATOMIC_RELEASE);
    if (!TR_JOIN_SPIN || tid || T < 2) return;
    long t0 = tr_now_ns(), budget = TR_MAX(20000L, (t0 - t_call) / 8);
    for (int i = 1; __atomic_load_n(done, __ATOMIC_ACQUIRE) < T; i++) {
        tr_cpu_relax();
        if (!(i & 63) && tr_now_ns() - t0 > budget) break;
    }
}
/* Phase timers for probes (benchmarks/cpu/probes): compiled only with -DTR_PROBE. Per thread,
   nanoseconds in phase 0 input copy (conv) / start after the call (GEMM, tr_drive_cols), 1 B-panel
   packing, 2 micro-kernels, 3 transposed NCHW store (conv) / A packing (GEMM), 4 (thread 0) the whole
   parallel region, 5 start after the call (conv), 6 shared-A row packing (GEMM, tr_drive_cols; the
   waits for other threads' rows stay in 3). */
#ifdef TR_PROBE
static double tr_probe_ns[64][8];
static inline long tr_probe_now(void) { return tr_now_ns(); }
#define TR_PROBE_BEGIN long tr_pt0 = tr_probe_now()
#define TR_PROBE_FROM(t) long tr_pt0 = (t)
#define TR_PROBE_LAP(ph, tid) do { long tr_pt1 = tr_probe_now(); tr_probe_ns[(tid) & 63][ph] += tr_pt1 - tr_pt0; tr_pt0 = tr_pt1; } while (0)
void tr_probe_read(double *dst) { memcpy(dst, tr_probe_ns, sizeof tr_probe_ns); memset(tr_probe_ns, 0, sizeof tr_probe_ns); }
#else
#define TR_PROBE_BEGIN do {} while (0)
#define TR_PROBE_FROM(t) do {} while (0)
#define TR_PROBE_LAP(ph, tid) do {} while (0)
#endif
"""

# Cephes-style expf: x = n*ln2 + r, |r| <= ln2/2, degree-6 polynomial; relative error ~1e-7. The upper
# clamp lets n reach 128, whose 2^n is +Inf: exp overflows to +Inf from x ~ 88.4 (so silu(-inf) is
# -inf/inf = NaN like PyTorch, not -inf; a clamp at 88.3 kept exp finite).
# erf: Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7).
#
# NaN and Inf (docs/architecture.md, "Numerics"): VMAX(a, b) / VMIN(a, b) return b when either is NaN
# (x86 maxps/minps; the scalar layer's ?: has the same rule; NEON returns NaN either way), so the value
# that must carry NaN through is always the *second* operand. exp's clamp keeps n = round(x log2 e) in
# [-127, 128], where VPOW2I builds 0 (n = -127) and +inf (n = 128) exactly: exp(-inf) = 0,
# exp(+inf) = +inf (from x > 88.37: the finite values up to FLT_MAX at 88.72 are not needed by any
# caller), exp(NaN) = NaN. ReLU is VMAX(0, x): relu(NaN) = NaN. The activations then follow IEEE
# arithmetic as PyTorch does: gelu(+inf) = silu(+inf) = +inf, gelu(-inf) = silu(-inf) = NaN
# (-inf * 0 and -inf / inf).
MATH = r"""
static inline V tr_vexp(V x) {
    x = VMIN(VSET1(89.0f), VMAX(VSET1(-88.0f), x));
    V n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    V r = VFMA(n, VSET1(-0.693359375f), x);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    V p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET1(1.0f)));
    return VMUL(p, VPOW2I(n));
}
static inline V tr_vtanh(V x) {
    V e = tr_vexp(VMUL(x, VSET1(2.0f)));
    return VSUB(VSET1(1.0f), VDIV(VSET1(2.0f), VADD(e, VSET1(1.0f))));
}
static inline V tr_verf(V x) {
    V a = VABS(x);
    V t = VDIV(VSET1(1.0f), VFMA(a, VSET1(0.3275911f), VSET1(1.0f)));
    V p = VSET1(1.061405429f);
    p = VFMA(p, t, VSET1(-1.453152027f));
    p = VFMA(p, t, VSET1(1.421413741f));
    p = VFMA(p, t, VSET1(-0.284496736f));
    p = VFMA(p, t, VSET1(0.254829592f));
    p = VMUL(p, t);
    V y = VSUB(VSET1(1.0f), VMUL(p, tr_vexp(VSUB(VZERO(), VMUL(a, a)))));
    return VORBITS(y, VSIGNBITS(x));
}
static inline V tr_vgelu_tanh(V x) {
    V u = VMUL(VSET1(0.7978845608028654f), VFMA(VMUL(VMUL(x, x), x), VSET1(0.044715f), x));
    return VMUL(VMUL(VSET1(0.5f), x), VADD(VSET1(1.0f), tr_vtanh(u)));
}
static inline V tr_vgelu_erf(V x) {
    return VMUL(VMUL(VSET1(0.5f), x), VADD(VSET1(1.0f), tr_verf(VMUL(x, VSET1(0.7071067811865476f)))));
}
static inline V tr_vsilu(V x) {
    return VDIV(x, VADD(VSET1(1.0f), tr_vexp(VSUB(VZERO(), x))));
}
"""

# A process-wide workspace reused across calls (page-faulting fresh buffers on every call costs more
# than a small GEMM); a concurrent caller that finds it busy allocates its own.
WORKSPACE = r"""
/* Slot 0: packing buffers of the blocked driver; slots 1, 2: the NHWC copies of an NCHW conv's input
   and output. */
static float *tr_ws_buf[3] = {0, 0, 0};
static size_t tr_ws_size[3] = {0, 0, 0};
static volatile int tr_ws_busy[3] = {0, 0, 0};
static float *tr_ws_slot(int slot, size_t floats, int *owned) {
    size_t bytes = TR_ROUNDUP(floats * sizeof(float) + TR_ALIGN, 4096);
    if (__sync_lock_test_and_set(&tr_ws_busy[slot], 1) == 0) {
        if (tr_ws_size[slot] < bytes) {
            free(tr_ws_buf[slot]);
            tr_ws_buf[slot] = (float *)aligned_alloc(4096, bytes);
            tr_ws_size[slot] = tr_ws_buf[slot] ? bytes : 0;
        }
        if (tr_ws_buf[slot]) { *owned = 0; return tr_ws_buf[slot]; }
        __sync_lock_release(&tr_ws_busy[slot]);
        return 0;
    }
    *owned = 1;
    return (float *)aligned_alloc(4096, bytes);
}
static void tr_ws_release(int slot, float *p, int owned) {
    if (owned) free(p); else __sync_lock_release(&tr_ws_busy[slot]);
}
static float *tr_ws_get(size_t floats, int *owned) { return tr_ws_slot(0, floats, owned); }
static void tr_ws_put(float *p, int owned) { tr_ws_release(0, p, owned); }
int tr_threads_available(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
"""

_STEP_C = {
    EpilogueKind.BIAS: "x = VADD(x, bias);",
    EpilogueKind.RELU: "x = VMAX(VZERO(), x);",  # x second: NaN passes (see MATH)
    EpilogueKind.GELU_TANH: "x = tr_vgelu_tanh(x);",
    EpilogueKind.GELU_ERF: "x = tr_vgelu_erf(x);",
    EpilogueKind.SILU: "x = tr_vsilu(x);",
}


#: the epilogue steps :func:`epilogue_c` emits
EPILOGUE_STEPS = frozenset(_STEP_C)


def epilogue_c(epilogue: Epilogue) -> str:
    """``tr_epi(x, bias)``: the epilogue chain applied to one vector of accumulators, in order."""
    body = "\n    ".join(_STEP_C[s] for s in epilogue.steps)
    return (f"#define TR_HAS_EPI {0 if epilogue.is_empty else 1}\n"
            f"#define TR_HAS_BIAS {1 if epilogue.has_bias else 0}\n"
            f"static inline V tr_epi(V x, V bias) {{\n    (void)bias;\n    {body}\n    return x;\n}}\n")


def prologue(isa: Isa) -> str:
    """Everything before the op-specific code: includes, the ISA layer, math and workspace."""
    return HEADER + isa.prelude + MATH + WORKSPACE
