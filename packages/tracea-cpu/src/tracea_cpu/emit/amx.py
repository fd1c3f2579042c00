"""bf16 GEMM on AMX tiles (``tdpbf16ps``), emitted as one C library (``tb_gemm``) that shares the
AVX512_BF16 GEMM's B packer and drivers (:mod:`.bf16`) and brings its own micro-kernel and A packer.

AMX has eight tile registers of up to 16 rows x 64 bytes. ``tdpbf16ps C, A, B`` adds to the 16 x 16
fp32 tile C the product of A (16 rows x 32 bf16 of K) and B (16 rows of k *pairs* x 16 columns: row t
holds the 32-bit words ``(B(2t, j), B(2t+1, j))``, the "VNNI" layout). That B layout is exactly the
AVX512_BF16 packer's panel (``b[t*NR + j]``), so one B tile is ``NR * 4`` bytes apart row to row
inside a packed panel. A is packed one whole tile after the other (``a[(s*MR + i)*16 + u]``: row i,
pair 16s + u), so an A tile is 1 KiB of consecutive rows. Panels are zero padded to whole tiles, K to 16 pairs.

The micro-kernel holds an MR x NR block of C in ``MR/16 x NR/16`` accumulator tiles, loads its tile
configuration once per thread and driver call (``TB_THREAD_BEGIN``: another library on the same
thread, e.g. oneDNN, may have loaded its own between calls; loading it per micro-kernel call cost
15-25%), stores the accumulators to an fp32 scratch block and runs the fp32 epilogue (bias, activation)
and the output conversion (fp32, or bf16 rounded to nearest even) with AVX-512. Each thread releases
its tiles when it leaves the driver's parallel region (``TB_THREAD_DONE``).

The Linux kernel only lets a process use tile data after ``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``; :mod:`tracea_cpu.amx` asks once per process before the first call.
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .amx_rows import rows_source
from .bf16 import BF16_LAYER, BIAS_TILE, DENSE, DRIVER, EDGE_STORE, PACK_B
from .common import epilogue_c, prologue

#: (MR, NR) register-tile shapes the emitter accepts: C tiles + A tiles + B tiles (or one B tile
#: reloaded per column group) must fit the eight tile registers.
AMX_TILES = ((32, 32), (16, 64), (16, 32), (32, 16), (16, 16))


def check_amx_tile(mr: int, nr: int) -> str | None:
    """Why an mr x nr AMX block cannot be emitted (None when it can)."""
    if mr <= 0 or nr <= 0 or mr % 16 or nr % 16:
        return f"AMX block {mr}x{nr} must be whole 16 x 16 tiles"
    mt, nt = mr // 16, nr // 16
    if mt * nt + mt + 1 > 8:
        return f"AMX block {mr}x{nr} needs {mt * nt + mt + 1} tile registers (8 exist)"
    return None


def tile_plan(mr: int, nr: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Tile registers of an mr x nr block: C tiles ``[i][j]``, one A tile per 16 rows, and B tiles -- every B
    tile of a k step in its own register when they fit, else two taking turns (the next one loads while
    the previous product runs), else one reloaded per column group. Raises ValueError for blocks that
    need more than the 8 registers."""
    why = check_amx_tile(mr, nr)
    if why:
        raise ValueError(why)
    mt, nt = mr // 16, nr // 16
    ctile = [[i * nt + j for j in range(nt)] for i in range(mt)]
    atile = [mt * nt + i for i in range(mt)]
    free = 8 - mt * nt - mt
    btile = [mt * nt + mt + j % min(nt, free) for j in range(nt)]
    return ctile, atile, btile


def k_loop(ctile: list[list[int]], atile: list[int], btile: list[int]) -> list[str]:
    """The k loop of a block: per 16 k pairs, the A tiles from packed A (``a``, MR rows per step), then
    for each column group its B tile from packed B (``b``, NR wide) and the products into the C tiles."""
    lines = ["    for (long t = 0; t < kp; t += 16) {"]
    lines += [f"        _tile_loadd({a}, a + t * MR + {i * 256}, 64);" for i, a in enumerate(atile)]
    for j, b in enumerate(btile):
        lines.append(f"        _tile_loadd({b}, b + t * NR + {j * 16}, NR * 4);")
        lines += [f"        _tile_dpbf16ps({ctile[i][j]}, {a}, {b});" for i, a in enumerate(atile)]
    lines.append("    }")
    return lines


def microkernel_c(mr: int, nr: int) -> str:
    """``tb_ukernel``: kp k pairs (a multiple of 16) of packed A x packed B -> an mr x nr block of C."""
    ctile, atile, btile = tile_plan(mr, nr)
    mt, nt = len(atile), len(btile)
    lines = [f"#define MR {mr}", f"#define NR {nr}", "#define KU 16", f"#define NV {nr // 16}",
             "typedef struct __attribute__((packed)) { uint8_t palette, start_row, reserved[14];",
             "    uint16_t colsb[16]; uint8_t rows[16]; } tb_tilecfg;",
             "static void tb_tiles_on(void) {",
             "    tb_tilecfg cfg;",
             "    memset(&cfg, 0, sizeof cfg);",
             "    cfg.palette = 1;",
             "    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }",
             "    _tile_loadconfig(&cfg);",
             "}",
             "#define TB_THREAD_BEGIN() tb_tiles_on()",
             "#define TB_THREAD_DONE() _tile_release()",
             "static void tb_ukernel(long kp, const uint32_t *restrict a, const uint32_t *restrict b,\n"
             "                       float *restrict c, long ldc, bf16 *restrict o, long ldo, int mr, int nr,\n"
             "                       int first, int last, const float *bias) {",
             "    float tile[MR * NR] __attribute__((aligned(64)));"]
    lines += [f"    _tile_zero({ctile[i][j]});" for i in range(mt) for j in range(nt)]
    lines += k_loop(ctile, atile, btile)
    lines += [f"    _tile_stored({ctile[i][j]}, tile + {i * 16 * nr + j * 16}, NR * 4);"
              for i in range(mt) for j in range(nt)]
    lines.append(_STORE)
    lines.append("}")
    return "\n".join(lines) + "\n"


# The fp32 block in ``tile`` -> C: add the partial sums of earlier K blocks, run the epilogue on the
# last one, write fp32 (``c``) or, on the last K block with a bf16 output, bf16 (``o``).
_STORE = r"""
    int fin = last && o;
""" + BIAS_TILE + r"""
    if (nr == NR) {
        for (int i = 0; i < mr; i++) {
            for (int v = 0; v < NV; v++) {
                V x = VLOAD(tile + i * NR + v * 16);
                if (!first) x = VADD(x, VLOAD(c + i * ldc + v * 16));
                if (last && TR_HAS_EPI) x = tr_epi(x, bt[v]);
                if (fin) BSTORE(o + i * ldo + v * 16, x); else VSTORE(c + i * ldc + v * 16, x);
            }
        }
        return;
    }""" + EDGE_STORE + "\n"

PACK_A = r"""
/* A micro-panel for AMX, one whole tile after the other: rows [i0, i0+mr), k in [p0, p0+kc) ->
   dst[(s*MR + i)*16 + u] = (A(i, 2t), A(i, 2t+1)) for pair t = 16s + u; zero padded to MR rows and
   kp = tb_pairs(kc) pairs. The A tile of rows 16q.. at k step s is 1 KiB at dst + (s*MR + 16q)*16. */
static void tb_pack_a(const tb_dense *x, long i0, long mr, long p0, long kc, uint32_t *dst) {
    long kp = tb_pairs(kc), steps = kp / 16;
    if (mr < MR || 2 * kp > kc) memset(dst, 0, sizeof(uint32_t) * kp * MR);
    if (x->cs == 1) {
        for (long i = 0; i < mr; i++) {
            const bf16 *s = x->p + (i0 + i) * x->rs + p0;
            long s_full = kc / 32;
            for (long q = 0; q < s_full; q++)
                _mm512_storeu_si512(dst + (q * MR + i) * 16, _mm512_loadu_si512(s + 32 * q));
            if (kc % 32) {
                __mmask32 m = (__mmask32)((1ull << (kc % 32)) - 1);
                _mm512_storeu_si512(dst + (s_full * MR + i) * 16, _mm512_maskz_loadu_epi16(m, s + 32 * s_full));
            }
        }
    } else {
        /* Transposed A (stored k-major): rows 2t and 2t+1 of the source interleave. */
        for (long t = 0; t < (kc + 1) / 2; t++) {
            const bf16 *r0 = x->p + (p0 + 2 * t) * x->cs + i0 * x->rs, *r1 = r0 + x->cs;
            uint32_t *d = dst + ((t / 16) * MR) * 16 + t % 16;
            if (2 * t + 1 < kc)
                for (long i = 0; i < mr; i++) d[i * 16] = tb_pair(r0[i * x->rs], r1[i * x->rs]);
            else
                for (long i = 0; i < mr; i++) d[i * 16] = r0[i * x->rs];
        }
    }
    (void)steps;
}
"""


def amx_gemm_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue) -> str:
    """Complete C source of the AMX bf16 GEMM library for one MR x NR block and epilogue chain
    (``isa``: the AVX-512 ISA whose ``V*`` layer the fp32 epilogue is written against)."""
    from .amx_blocks import PACKED_B, block_driver_c, block_kernel_c
    from .f16_split import SPLIT

    return "\n".join([prologue(isa), BF16_LAYER, epilogue_c(epilogue), microkernel_c(mr, nr), DENSE, PACK_A,
                      PACK_B, rows_source(), block_kernel_c(mr, nr), block_driver_c(), DRIVER, PACKED_B, SPLIT])
