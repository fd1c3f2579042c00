"""A register-only FMA loop used to measure this machine's fp32 FMA peak (benchmarks compare every
kernel with it): independent accumulator chains, enough to cover FMA latency x FMA ports."""

from __future__ import annotations

from ..isa import Isa
from .common import prologue


def _peak_loop(isa: Isa, name: str, per_iter: str, chains: int, operands: str, step: str,
               flops_per_lane: int) -> str:
    """``double {name}(iters, nth)``: ``chains`` independent accumulators, each updated by ``step`` (with
    ``{a}`` for the accumulator) per iteration on every thread; ``int {per_iter}()`` gives the flops."""
    acc = [f"a{i}" for i in range(chains)]
    lines = [prologue(isa),
             f"double {name}(long iters, int nth) {{",
             "    double total = 0.0;",
             "    #pragma omp parallel num_threads(nth) reduction(+:total)",
             "    {",
             f"        {operands}"]
    lines += [f"        V {a} = VSET1({i}.0f);" for i, a in enumerate(acc)]
    lines.append("        for (long t = 0; t < iters; t++) {")
    lines += [f"            {a} = {step.format(a=a)};" for a in acc]
    lines.append("            __asm__ volatile(\"\" ::: \"memory\");")
    lines.append("        }")
    lines.append("        V s = " + " ".join(f"VADD({a}," for a in acc[1:]) + f" {acc[0]}" + ")" * (len(acc) - 1) + ";")
    lines.append("        float buf[VW]; VSTORE(buf, s); for (int i = 0; i < VW; i++) total += buf[i];")
    lines += ["    }", "    return total;", "}",
              f"int {per_iter}(void) {{ return {chains} * VW * {flops_per_lane}; }}"]
    return "\n".join(lines) + "\n"


def peak_source(isa: Isa, chains: int | None = None) -> str:
    return _peak_loop(isa, "tr_fma_peak", "tr_fma_per_iter", chains or min(24, isa.registers - 4),
                      "V x = VSET1(0.9999999f), y = VSET1(1e-7f);", "VFMA({a}, x, y)", 2)


def bf16_peak_source(isa: Isa, chains: int = 24) -> str:
    """Like :func:`peak_source` for ``vdpbf16ps`` (AVX512_BF16; compile with its flags): independent
    accumulator chains of bf16 pair dot products, 4 flops per fp32 lane per instruction."""
    return _peak_loop(isa, "tr_bf16_peak", "tr_bf16_per_iter", chains,
                      "__m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);",
                      "_mm512_dpbf16_ps({a}, x, y)", 4)
