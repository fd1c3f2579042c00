"""A register-only FMA loop used to measure this machine's fp32 FMA peak (benchmarks compare every
kernel with it): independent accumulator chains, enough to cover FMA latency x FMA ports."""

from __future__ import annotations

from ..isa import Isa
from .common import prologue


def peak_source(isa: Isa, chains: int | None = None) -> str:
    chains = chains or min(24, isa.registers - 4)
    acc = [f"a{i}" for i in range(chains)]
    lines = [prologue(isa),
             "double tr_fma_peak(long iters, int nth) {",
             "    double total = 0.0;",
             "    #pragma omp parallel num_threads(nth) reduction(+:total)",
             "    {",
             "        V x = VSET1(0.9999999f), y = VSET1(1e-7f);"]
    lines += [f"        V {a} = VSET1({i}.0f);" for i, a in enumerate(acc)]
    lines.append("        for (long t = 0; t < iters; t++) {")
    lines += [f"            {a} = VFMA({a}, x, y);" for a in acc]
    lines.append("            __asm__ volatile(\"\" ::: \"memory\");")
    lines.append("        }")
    lines.append("        V s = " + " ".join(f"VADD({a}," for a in acc[1:]) + f" {acc[0]}" + ")" * (len(acc) - 1) + ";")
    lines.append("        float buf[VW]; VSTORE(buf, s); for (int i = 0; i < VW; i++) total += buf[i];")
    lines += ["    }", "    return total;", "}",
              f"int tr_fma_per_iter(void) {{ return {chains} * VW * 2; }}"]
    return "\n".join(lines) + "\n"


def bf16_peak_source(isa: Isa, chains: int = 24) -> str:
    """Like :func:`peak_source` for ``vdpbf16ps`` (AVX512_BF16; compile with its flags): independent
    accumulator chains of bf16 pair dot products, 4 flops per fp32 lane per instruction."""
    acc = [f"a{i}" for i in range(chains)]
    lines = [prologue(isa),
             "double tr_bf16_peak(long iters, int nth) {",
             "    double total = 0.0;",
             "    #pragma omp parallel num_threads(nth) reduction(+:total)",
             "    {",
             "        __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);"]
    lines += [f"        V {a} = VSET1({i}.0f);" for i, a in enumerate(acc)]
    lines.append("        for (long t = 0; t < iters; t++) {")
    lines += [f"            {a} = _mm512_dpbf16_ps({a}, x, y);" for a in acc]
    lines.append("            __asm__ volatile(\"\" ::: \"memory\");")
    lines.append("        }")
    lines.append("        V s = " + " ".join(f"VADD({a}," for a in acc[1:]) + f" {acc[0]}" + ")" * (len(acc) - 1) + ";")
    lines.append("        float buf[VW]; VSTORE(buf, s); for (int i = 0; i < VW; i++) total += buf[i];")
    lines += ["    }", "    return total;", "}",
              f"int tr_bf16_per_iter(void) {{ return {chains} * VW * 4; }}"]
    return "\n".join(lines) + "\n"
