"""CUDA C++ templates of the Hopper GEMM's epilogues (rendered by :mod:`.wgmma`): the column-major
stores of a swapped product (register-fed A: row pairs; smem-fed A: single values), the staged row-major store, the direct store, and the deferred epilogue (a
tile's values stashed in shared memory, the activation and the stores run under the next tile's MMA)."""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue, EpilogueKind

TRANSPOSED = """        // Epilogue, column-major C (ldc = M): fragment rows g and g + 8 are adjacent m -> one pair store.
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub) {{
            const int h = 0, row = m0 + {lrow};
            {cm_bias_rows}
            #pragma unroll
            for (int j2 = 0; j2 < {bn8}; ++j2)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {{
                    const int col = n0 + j2 * 8 + 2 * t4 + e;
                    if (col >= N || row >= M) continue;
                    {cm_bias_col}
                    const float v0 = apply_epilogue_b({accn}[sub][4 * j2 + e], b0);
                    const float v1 = apply_epilogue_b({accn}[sub][4 * j2 + 2 + e], b1);
                    {tout}* p = Cb + (long long)col * M + row;
                    {cm_store}
                }}
        }}
"""

TRANSPOSED_ROWS = """        // Epilogue, column-major C (ldc = M), accumulator rows in fragment order (smem-fed A): a thread holds
        // rows g and g + 8, so each value is its own store; 8 lanes (g) write 8 adjacent m of one column.
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {{
                const int row = m0 + {lrow};
                const float b0 = bias_at(bias, row < M ? row : 0);
                #pragma unroll
                for (int j2 = 0; j2 < {bn8}; ++j2)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {{
                        const int col = n0 + j2 * 8 + 2 * t4 + e;
                        if (col >= N || row >= M) continue;
                        const float v0 = apply_epilogue_b({accn}[sub][4 * j2 + 2 * h + e], b0);
                        Cb[(long long)col * M + row] = {c0};
                    }}
            }}
"""

STAGED = """        // Epilogue: accumulators -> epilogue chain -> per-warp smem staging (padded rows, conflict-free)
        // -> 16-byte coalesced global stores (row segments of 128 B).
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub) {{
            const int rbase = m0 + {rowbase} + warp * 16;
            {bias_rows}
            #pragma unroll
            for (int cc = 0; cc < {n_cc}; ++cc) {{
                #pragma unroll
                for (int jj = 0; jj < {cc8}; ++jj) {{
                    const int j2 = cc * {cc8} + jj;
                    if (j2 >= {bn8}) break;  // a tile_n that is not a whole number of passes: the last one is partial
                    const int col = n0 + j2 * 8 + 2 * t4;
                    {bias_pair}
                    #pragma unroll
                    for (int h = 0; h < 2; ++h) {{
                        {bias_h}
                        {tout}* e = ebuf + (g + 8 * h) * {ld} + jj * 8 + 2 * t4;
                        {smem_pair}
                    }}
                }}
                __syncwarp();
                #pragma unroll
                for (int i = 0; i < 4; ++i) {{
                    const int idx = lane + 32 * i, r = idx / 8, c = (idx % 8) * {vec};
                    const int row = rbase + r, col = n0 + cc * {cc_cols} + c;
                    if (row < M && cc * {cc_cols} + c < {bn}) {{
                        const {tout}* e = ebuf + r * {ld} + c;
                        {tout}* p = Cb + (long long)row * N + col;
                        if ({vs} && col + {vec} <= N) {{
                            u32 x0, x1, x2, x3;
                            asm volatile("ld.shared.v4.u32 {{%0,%1,%2,%3}}, [%4];" : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(smem_u32(e)));
                            asm volatile("st.global.v4.u32 [%0], {{%1,%2,%3,%4}};" :: "l"(p), "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
                        }} else if ({ns} && col + {vec} <= N) {{  // rows 8- or 4-byte aligned: the vector in pieces
                            u32 x0, x1, x2, x3;
                            asm volatile("ld.shared.v4.u32 {{%0,%1,%2,%3}}, [%4];" : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(smem_u32(e)));
                            if ({ns} == 8) {{
                                asm volatile("st.global.v2.u32 [%0], {{%1,%2}};" :: "l"(p), "r"(x0), "r"(x1) : "memory");
                                asm volatile("st.global.v2.u32 [%0], {{%1,%2}};" :: "l"(p + {vec} / 2), "r"(x2), "r"(x3) : "memory");
                            }} else {{
                                u32* q4 = reinterpret_cast<u32*>(p);
                                q4[0] = x0; q4[1] = x1; q4[2] = x2; q4[3] = x3;
                            }}
                        }} else {{
                            #pragma unroll
                            for (int q = 0; q < {vec}; ++q) if (col + q < N) p[q] = e[q];
                        }}
                    }}
                }}
                __syncwarp();
            }}
        }}
"""

DIRECT = """        // Epilogue: accumulators -> epilogue chain -> direct (4-byte pair) stores from the fragment layout.
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int row = m0 + {lrow};
            if (row >= M) continue;
            #pragma unroll
            for (int j2 = 0; j2 < {bn8}; ++j2) {{
                const int col = n0 + j2 * 8 + 2 * t4;
                {bias_pair}
                const float v0 = apply_epilogue_b({accn}[sub][4 * j2 + 2 * h], b0);
                const float v1 = apply_epilogue_b({accn}[sub][4 * j2 + 2 * h + 1], b1);
                {{ {tout}* C = Cb; {store} }}
            }}
        }}
"""

# One chunk of a deferred epilogue: 16-byte vectors of the warp's stashed slice (whole rows per
# instruction, conflict-free), the activation on each value, 16-byte coalesced global stores. A tile's
# chunks run one per k-step of the next tile, after its stage release.
DEFER_CHUNK = """
static __device__ __forceinline__ void defer_chunk(u32 stash, unsigned short* C, int row0, int col0, int M, int N,
                                                   int c, int lane) {{
    const int v = c * 32 + lane, sr = v / {bn8}, grp = v % {bn8};  // chunk c: one 16-byte vector per lane
    const int row = row0 + (sr >> 4) * 64 + (sr & 15), col = col0 + grp * 8;
    u32 x[4];
    asm volatile("ld.shared.v4.u32 {{%0,%1,%2,%3}}, [%4];" : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(stash + sr * {ldb} + grp * 16));
    #pragma unroll
    for (int q = 0; q < 4; ++q) {{
        float v0, v1;
        {unpack}
        {act}
        asm("cvt.rn.{suffix}.f32 %0, %1, %2;" : "=r"(x[q]) : "f"(v1), "f"(v0));
    }}
    if (row < M) {{
        unsigned short* p = C + (long long)row * N + col;
        if ({vs} && col + 8 <= N) {{
            asm volatile("st.global.v4.u32 [%0], {{%1,%2,%3,%4}};" :: "l"(p), "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3])
                         : "memory");
        }} else {{
            #pragma unroll
            for (int q = 0; q < 8; ++q) if (col + q < N) p[q] = (unsigned short)(x[q >> 1] >> (16 * (q & 1)));
        }}
    }}
}}
"""

STASH = """        // Deferred epilogue: finish the previous tile's chunks, then stash this tile's values (the chain up to
        // its trailing activation, rounded to the output dtype) in this warp's slice; the activation and the stores run
        // during the next tile's mainloop, where the MUFU and FMA pipes are otherwise idle.
    {defer_tail}        __syncwarp();
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub)
            #pragma unroll
            for (int j2 = 0; j2 < {bn8}; ++j2) {{
                const int col = n0 + j2 * 8 + 2 * t4;
                {bias_pair}
                #pragma unroll
                for (int h = 0; h < 2; ++h) {{
                    const float v0 = apply_epilogue_b(d[sub][4 * j2 + 2 * h], b0);
                    const float v1 = apply_epilogue_b(d[sub][4 * j2 + 2 * h + 1], b1);
                    u32 pk;
                    asm("cvt.rn.{suffix}.f32 %0, %1, %2;" : "=r"(pk) : "f"(v1), "f"(v0));
                    asm volatile("st.shared.u32 [%0], %1;" :: "r"(stash + (sub * 16 + g + 8 * h) * {ldb} + (j2 * 8 + 2 * t4) * 2),
                                 "r"(pk));
                }}
            }}
        __syncwarp();
        pend = {nchunk}; pC = Cb; prow = m0 + {rowbase0} + warp * 16; pn0 = n0;
"""


def deferred_split(epilogue: Epilogue) -> tuple[Epilogue, str]:
    """(the chain applied before the stash, C statements applying its trailing activation to ``v0``/``v1``):
    a trailing GELU/SiLU is deferred (MUFU work), everything else runs before the stash."""
    steps = tuple(epilogue)
    acts = {EpilogueKind.GELU_TANH: "{v} = gelu_tanh_half(0.5f * {v});", EpilogueKind.GELU_ERF: "{v} = gelu_erf_f({v});",
            EpilogueKind.SILU: "{v} = silu_f({v});"}
    if steps and steps[-1] in acts:
        code = acts[steps[-1]]
        return Epilogue(steps[:-1]), code.replace("{v}", "v0") + " " + code.replace("{v}", "v1")
    return epilogue, ""
