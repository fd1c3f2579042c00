"""The MR x NR register micro-kernel, generated fully unrolled so the C compiler allocates one vector
register per accumulator.

Packed operands: the A micro-panel is k-blocked, ``a[t*MR*KU + i*KU + u]`` for k = t*KU + u (so every
broadcast has a constant displacement from one base pointer), the B micro-panel is ``b[k*NR + j]``.
Full tiles are finished in registers (accumulate into C when this is not the first K block, apply
the epilogue on the last); edge tiles go through a small aligned tile buffer.
"""

from __future__ import annotations

from ..isa import Isa


#: Software prefetch distance of the packed A and B micro-panels, in k steps (``TR_PF_A`` / ``TR_PF_B``
#: in the C source; 0 turns it off). The panels of a K block are larger than L1 and stream from L2:
#: measured on the 2-core Intel Xeon (AVX-512, 14x32 tile, 2048^3, one thread, kc 512-1024), distance 8
#: ran 157-165 GFLOP/s against 146-155 without; 16 and more gained less.
PREFETCH_K = 8
#: Per ISA where measured otherwise. AVX2 (2-core AMD EPYC Zen 3 VM, 4x24 tile, kc 512, two threads,
#: ``benchmarks/cpu/probes/gemm_phases.py --cflags`` A/B in one process): without the prefetches 512^3
#: 1.94-2.01 vs 2.12-2.13 ms, 768^3 6.67-6.93 vs 7.17-7.55, 1024^3 14.98-15.54 vs 16.22-16.31, 2048 x
#: 1024 x 4096 122 vs 130 ms, 512 x 4096 x 4096 122 vs 126 ms: the hardware prefetchers follow the
#: panels, and the extra load-port instructions (20 per 8 k steps) only cost. Distance 16 was slower still.
PREFETCH_K_BY_ISA = {"avx2": 0}


def prefetch_k(isa: Isa) -> int:
    """The default prefetch distance of ``isa``'s packed micro-kernel (see :data:`PREFETCH_K`)."""
    return PREFETCH_K_BY_ISA.get(isa.name, PREFETCH_K)


def microkernel_c(isa: Isa, mr: int, nr: int, ku: int) -> str:
    """``tr_ukernel``: packed A (k-blocked) x packed B panel -> C tile, plus ``tr_ukernel_ind`` (A rows
    read in place through per-row pointers, for NHWC conv)."""
    return _packed_kernel(isa, mr, nr, ku) + _indirect_kernel(isa, mr, nr)


def _packed_kernel(isa: Isa, mr: int, nr: int, ku: int) -> str:
    nv = nr // isa.width
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [f"#define MR {mr}", f"#define NR {nr}", f"#define KU {ku}", f"#define NV {nv}",
             f"#ifndef TR_PF_B\n#define TR_PF_B {prefetch_k(isa)}\n#endif",
             f"#ifndef TR_PF_A\n#define TR_PF_A {prefetch_k(isa)}\n#endif"]
    lines.append("static void tr_ukernel(long kcp, const float *restrict a, const float *restrict b,\n"
                 "                       float *restrict c, long ldc, int mr, int nr, int first, int last,\n"
                 "                       const float *bias, int bias_row) {")
    for i in range(mr):
        lines.append("    V " + ", ".join(f"{n} = VZERO()" for n in acc[i]) + ";")
    lines += _prefetch_c(nr)
    lines.append("    for (long t = 0; t < kcp; t += KU) {")
    a_lines = -(-mr * ku * 4 // 64)  # 64-byte lines of A one unroll group reads
    for u in range(ku):
        lines.append("        {")
        lines.append("#if TR_PF_B")
        for off in range(0, nr, 16):
            lines.append(f"        VPREFETCH(b + TR_PF_B * NR + {u * nr + off});")
        lines.append("#endif")
        lines.append("#if TR_PF_A")
        for q in range(u, a_lines, ku):
            lines.append(f"        VPREFETCH(a + TR_PF_A * MR + {q * 16});")
        lines.append("#endif")
        for v in range(nv):
            lines.append(f"        V b{v} = VLOAD(b + {u * nr + v * isa.width});")
        for i in range(mr):
            lines.append(f"        {{ V ai = VSET1(a[{i * ku + u}]);")
            for v in range(nv):
                lines.append(f"          {acc[i][v]} = VFMA(ai, b{v}, {acc[i][v]});")
            lines.append("        }")
        lines.append("        }")
    lines.append(f"        a += {mr * ku}; b += {ku * nr};")
    lines.append("    }")
    lines += _store(isa, mr, nr, acc)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _prefetch_c(nr: int) -> list[str]:
    """Prefetch the C tile (every 64-byte line of its rows) before the k loop: the tile is read (partial
    sums of earlier K blocks) or written right after the loop, and its rows lie a whole C row apart, so
    without this the store phase waits for MR x NR/16 cache misses from L3 or memory in a row."""
    offs = sorted(set(range(0, nr, 16)) | {nr - 1})
    body = " ".join(f"VPREFETCH(c + i * ldc + {o});" for o in offs)
    return [f"    if (mr == MR && nr == NR) for (int i = 0; i < MR; i++) {{ {body} }}"]


def _store(isa: Isa, mr: int, nr: int, acc: list[list[str]], nonfinite: bool = False) -> list[str]:
    """Finish a tile: full tiles in registers (accumulate, epilogue, store), edge tiles via a buffer.

    ``nonfinite``: the kernel takes an ``int *nfp``; when it is not null, ``*nfp`` is set to 1 if an
    accumulator of this K block is NaN or +-Inf: their sum times 0 is NaN then (or when the sum
    overflows, a harmless false alarm), a tree of adds, a multiply and a compare per tile (~1/kc of
    its FMAs). The indirect conv uses it to find out whether the taps it skipped over padding would
    have made 0 * Inf = NaN (see ``tr_conv2d``)."""
    nv = nr // isa.width
    lines: list[str] = []
    if nonfinite:
        terms = [a for row in acc for a in row]
        lines.append("    if (nfp) {")
        level = 0
        while len(terms) > 1:  # pairwise: depth log2(MR * NV), not a chain of MR * NV dependent adds
            nxt = []
            for q in range(0, len(terms) - 1, 2):
                name = f"nf{level}_{q // 2}"
                lines.append(f"        V {name} = VADD({terms[q]}, {terms[q + 1]});")
                nxt.append(name)
            if len(terms) % 2:
                nxt.append(terms[-1])
            terms, level = nxt, level + 1
        lines.append(f"        if (VANYNAN(VMUL({terms[0]}, VZERO()))) *nfp = 1;")
        lines.append("    }")
    # Full tile: finish in registers.
    lines.append("    if (mr == MR && nr == NR) {")
    lines.append("        if (last && TR_HAS_EPI) {")
    lines.append("            V bv[NV];")
    lines.append("            for (int v = 0; v < NV; v++) bv[v] = (TR_HAS_BIAS && !bias_row) ? VLOAD(bias + v * VW) : VZERO();")
    for i in range(mr):
        lines.append(f"            {{ V br = (TR_HAS_BIAS && bias_row) ? VSET1(bias[{i}]) : VZERO();")
        for v in range(nv):
            off = f"{i}*ldc + {v * isa.width}"
            lines.append(f"              {{ V x = {acc[i][v]}; if (!first) x = VADD(x, VLOAD(c + {off}));")
            lines.append(f"                VSTORE(c + {off}, tr_epi(x, bias_row ? br : bv[{v}])); }}")
        lines.append("            }")
    lines.append("        } else if (first) {")
    for i in range(mr):
        for v in range(nv):
            lines.append(f"            VSTORE(c + {i}*ldc + {v * isa.width}, {acc[i][v]});")
    lines.append("        } else {")
    for i in range(mr):
        for v in range(nv):
            off = f"{i}*ldc + {v * isa.width}"
            lines.append(f"            VSTORE(c + {off}, VADD(VLOAD(c + {off}), {acc[i][v]}));")
    lines.append("        }")
    lines.append("        return;")
    lines.append("    }")
    # Edge tile: through an aligned buffer, then only the valid mr x nr part is written.
    lines.append("    float tile[MR * NR] __attribute__((aligned(64)));")
    for i in range(mr):
        for v in range(nv):
            lines.append(f"    VSTORE(tile + {i * nr + v * isa.width}, {acc[i][v]});")
    lines.append("""    for (int i = 0; i < mr; i++) {
        float *ti = tile + i * NR;
        if (!first) for (int j = 0; j < nr; j++) ti[j] += c[i * ldc + j];
        if (last && TR_HAS_EPI) {
            float bt[NR] __attribute__((aligned(64)));
            for (int j = 0; j < NR; j++)
                bt[j] = !TR_HAS_BIAS ? 0.0f : (bias_row ? bias[i] : (j < nr ? bias[j] : 0.0f));
            for (int v = 0; v < NV; v++) VSTORE(ti + v * VW, tr_epi(VLOAD(ti + v * VW), VLOAD(bt + v * VW)));
        }
        for (int j = 0; j < nr; j++) c[i * ldc + j] = ti[j];
    }""")
    return lines


# acc += a * b for the indirect kernel's accumulators. On x86 (AVX2 / AVX-512) one vfmadd231ps whose
# accumulator operand is tied to its output ("+v"): with the intrinsic, GCC 12 let the accumulators of
# the 4-step unrolled 6x64 loop wander between registers (vfmadd132ps into the broadcast register) and
# paid 8 register moves and a spill per 96 FMAs to put them back at the loop's end.
_ACC_FMA = """#if defined(__x86_64__) && (defined(__AVX512F__) || defined(__AVX2__)) && !defined(TR_NO_ASM_FMA)
#define TR_ACC_FMA(acc, a, b) __asm__("vfmadd231ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#else
#define TR_ACC_FMA(acc, a, b) ((acc) = VFMA(a, b, acc))
#endif"""


def _indirect_kernel(isa: Isa, mr: int, nr: int) -> str:
    """Like ``tr_ukernel`` but A row i of segment sg is ``rows[sg*MR + i][0:seg_len[sg]]`` (unit stride),
    against B panel rows from ``b + seg_off[sg]``: the NHWC conv gathers nothing, each pointer is an
    input pixel's channel run (or a zero row). ``seg_skip[sg]`` bit 0 / bit 1: tile row 0 / row MR-1
    reads only padding in that segment, and its FMAs are left out (a row tile's left / right border).
    ``nfp``: see :func:`_store`."""
    nv = nr // isa.width
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [_ACC_FMA, "static void tr_ukernel_ind(int nseg, const long *restrict seg_len, const long *restrict seg_off,\n"
             "                           const int *restrict seg_skip, const float *const *restrict rows,\n"
             "                           const float *restrict b, float *restrict c, long ldc, int mr, int nr,\n"
             "                           int first, int last, const float *bias, int bias_row, int *nfp) {"]
    for i in range(mr):
        lines.append("    V " + ", ".join(f"{n} = VZERO()" for n in acc[i]) + ";")
    lines.append("    for (int sg = 0; sg < nseg; sg++) {")
    for i in range(mr):
        lines.append(f"        const float *restrict r{i} = rows[sg * MR + {i}];")
    lines.append("        const float *restrict bs = b + seg_off[sg];")
    lines.append("        long len = seg_len[sg], k = 0;")

    def step(kexpr: str, tile_rows: range) -> list[str]:
        out = ["        {"]
        for v in range(nv):
            out.append(f"        V b{v} = VLOAD(bs + ({kexpr}) * NR + {v * isa.width});")
        for i in tile_rows:
            out.append(f"        {{ V ai = VSET1(r{i}[{kexpr}]);")
            for v in range(nv):
                out.append(f"          TR_ACC_FMA({acc[i][v]}, ai, b{v});")
            out.append("        }")
        out.append("        }")
        return out

    variants = [(0, range(mr))]
    if mr >= 2:
        variants += [(1, range(1, mr)), (2, range(mr - 1)), (3, range(1, mr - 1))]
    for n, (code, tile_rows) in enumerate(variants):
        cond = "" if n == len(variants) - 1 else f"if (seg_skip[sg] == {code}) "
        lines.append(f"        {'else ' if n else ''}{cond}{{")
        lines.append("        for (; k + 4 <= len; k += 4) {")
        for u in range(4):
            lines += step(f"k + {u}", tile_rows)
        lines.append("        }")
        lines.append("        for (; k < len; k++) {")
        lines += step("k", tile_rows)
        lines.append("        }")
        lines.append("        }")
    lines.append("    }")
    lines += _store(isa, mr, nr, acc, nonfinite=True)
    lines.append("}")
    return "\n".join(lines) + "\n"
