"""Render OpenCL C for one GEMM or implicit-GEMM conv2d kernel from a :class:`KernelSpec`.

Both ops share one template: C[m, n] = epilogue(sum_k A(m, k) * B(k, n)). What differs is how an A row,
a B column and a C element are addressed:

* GEMM: A is (M, K) or, transposed, (K, M); B is (K, N) or (N, K); C is (M, N). A batch index comes
  from ``get_global_id(2)``.
* conv2d: A(m, k) is gathered from the input (m = output pixel (img, p, q); k = (c, r, s) in the
  weight's order) through a per-k table of (input offset, dh, dw); out-of-image taps read zero.
  B(k, n) is the weight of output channel n (KCRS or KRSC rows); C is NCHW or NHWC. The group index
  comes from ``get_global_id(2)``.

Rows and columns past M/N are clamped for loads (their results are never stored); the k tail is
handled by a remainder loop (direct kernels) or zero-filled staging (local-memory kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.ir.epilogue import Epilogue

from . import epilogue_cl
from .tiling import Tiling

KERNEL_NAMES = {"gemm": "tracea_gemm", "conv": "tracea_conv2d"}
_COMPONENTS = "0123456789abcdef"


@dataclass(frozen=True)
class ConvGeometry:
    """Compile-time constants of one conv2d (everything but the batch size)."""

    nhwc: bool
    c: int
    h: int
    w: int
    k: int
    p: int
    q: int
    cg: int
    kg: int
    kdim: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    needs_bounds: bool


@dataclass(frozen=True)
class KernelSpec:
    """Everything that selects a distinct program: op family, dtypes, transposes, edge flags, epilogue,
    conv geometry and tiling."""

    kind: str  # "gemm" | "conv"
    tiling: Tiling
    in_type: str = "float"  # "float" | "half"
    out_type: str = "float"
    bias_type: str | None = None
    epilogue: Epilogue = Epilogue()
    trans_a: bool = False
    trans_b: bool = False
    even_m: bool = False
    even_n: bool = False
    even_k: bool = False
    conv: ConvGeometry | None = None
    #: B arrives packed in column panels, ``Bp[batch][N / tile_n][K][tile_n]`` zero-padded past N (the
    #: launcher packs it, see pack.py): each work-group then reads one contiguous K x tile_n block.
    #: Direct (non-local) kernels only.
    pack_b: bool = False

    @property
    def kernel_name(self) -> str:
        return KERNEL_NAMES[self.kind]

    @property
    def vector_b(self) -> bool:
        """B rows are contiguous along n, so a column group is one vector load."""
        if self.tiling.vw == 1:
            return False
        return self.pack_b or (self.kind == "gemm" and not self.trans_b and self.even_n)

    @property
    def vector_c(self) -> bool:
        """C rows are contiguous along n and the tile never crosses N: vector stores."""
        contiguous = self.kind == "gemm" or (self.conv is not None and self.conv.nhwc)
        return contiguous and self.even_n and self.tiling.vw > 1


def _load(ctype: str, ptr: str, idx: str) -> str:
    return f"vload_half({idx}, {ptr})" if ctype == "half" else f"{ptr}[{idx}]"


class _Renderer:
    def __init__(self, spec: KernelSpec) -> None:
        self.s = spec
        self.t = spec.tiling
        self.conv = spec.conv
        self.lines: list[str] = []

    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)

    # -- operand addressing -------------------------------------------------------------------------
    def a_row_setup(self, name: str, mexpr: str, ind: int) -> None:
        """Declare the row state of A row ``mexpr`` under prefix ``name``."""
        s = self.s
        mc = f"({mexpr})" if s.even_m else f"min({mexpr}, M - 1)"
        if s.kind == "gemm":
            self.emit(f"const int {name} = {mc}{'' if s.trans_a else ' * K'};", ind)
            return
        g = self.conv
        assert g is not None
        self.emit(f"const int {name}_m = {mc};", ind)
        self.emit(f"const int {name}_img = {name}_m / {g.p * g.q};", ind)
        self.emit(f"const int {name}_pq = {name}_m - {name}_img * {g.p * g.q};", ind)
        self.emit(f"const int {name}_h = ({name}_pq / {g.q}) * {g.stride[0]} - {g.padding[0]};", ind)
        self.emit(f"const int {name}_w = ({name}_pq % {g.q}) * {g.stride[1]} - {g.padding[1]};", ind)
        if g.nhwc:
            self.emit(f"const int {name} = (({name}_img * {g.h} + {name}_h) * {g.w} + {name}_w) * {g.c}"
                      f" + grp * {g.cg};", ind)
        else:
            self.emit(f"const int {name} = {name}_img * {g.c * g.h * g.w} + grp * {g.cg * g.h * g.w}"
                      f" + {name}_h * {g.w} + {name}_w;", ind)

    def k_prep(self, kexpr: str, name: str, ind: int) -> None:
        if self.s.kind == "conv":
            self.emit(f"const int4 {name} = tab[{kexpr}];", ind)

    def a_load(self, row: str, kexpr: str, kname: str) -> str:
        s = self.s
        if s.kind == "gemm":
            idx = f"{row} + ({kexpr}) * M" if s.trans_a else f"{row} + {kexpr}"
            return _load(s.in_type, "A", idx)
        g = self.conv
        assert g is not None
        val = _load(s.in_type, "A", f"{row} + {kname}.x")
        if not g.needs_bounds:
            return val
        return (f"(((uint)({row}_h + {kname}.y) < {g.h}u && (uint)({row}_w + {kname}.z) < {g.w}u)"
                f" ? {val} : 0.0f)")

    def b_col_setup(self, name: str, nexpr: str, ind: int) -> None:
        s = self.s
        nc = f"({nexpr})" if s.even_n else f"min({nexpr}, N - 1)"
        if s.kind == "gemm":
            self.emit(f"const int {name} = {nc}{' * K' if s.trans_b else ''};", ind)
        else:
            self.emit(f"const int {name} = (grp * {self.conv.kg} + {nc}) * {self.conv.kdim};", ind)  # type: ignore[union-attr]

    def b_load(self, col: str, kexpr: str) -> str:
        s = self.s
        if s.pack_b:
            return _load(s.in_type, "B", f"({kexpr}) * {self.t.tile_n} + {col}")
        if s.kind == "gemm" and not s.trans_b:
            return _load(s.in_type, "B", f"({kexpr}) * N + {col}")
        return _load(s.in_type, "B", f"{col} + {kexpr}")

    # -- kernel -------------------------------------------------------------------------------------
    def render(self) -> str:
        s, t = self.s, self.t
        vw = t.vw
        tv = "float" if vw == 1 else f"float{vw}"
        ng = t.rn // vw
        head = ["// Generated by tracea_opencl.render; one program per KernelSpec.",
                epilogue_cl.ACTIVATION_FUNCTIONS]
        args = [f"__global const {s.in_type}* restrict A", "const int offA",
                f"__global const {s.in_type}* restrict B", "const int offB",
                f"__global const {s.bias_type or 'float'}* restrict bias", "const int offBias",
                f"__global {s.out_type}* restrict C", "const int offC"]
        if s.kind == "conv":
            args.append("__global const int4* restrict tab")
        args += ["const int M", "const int N", "const int K"]
        head.append(f"__kernel __attribute__((reqd_work_group_size({t.wg_n}, {t.wg_m}, 1)))")
        head.append(f"void {s.kernel_name}({', '.join(args)})")
        self.lines = head + ["{"]
        self.emit("const int lid_n = get_local_id(0), lid_m = get_local_id(1);")
        if t.raster:
            # Grouped ordering: linear group id -> (row-block, column-block), `raster` row-blocks per band.
            self.emit("const int gm_n = get_num_groups(1), gn_n = get_num_groups(0);")
            self.emit("const int gid = get_group_id(1) * gn_n + get_group_id(0);")
            self.emit(f"const int band = gid / ({t.raster} * gn_n), first_m = band * {t.raster};")
            self.emit(f"const int band_m = min(gm_n - first_m, {t.raster});")
            self.emit("const int in_band = gid - band * " + str(t.raster) + " * gn_n;")
            self.emit(f"const int bm = (first_m + in_band % band_m) * {t.tile_m};")
            self.emit(f"const int bn = (in_band / band_m) * {t.tile_n};")
        else:
            self.emit(f"const int bn = get_group_id(0) * {t.tile_n}, bm = get_group_id(1) * {t.tile_m};")
        if s.kind == "gemm":
            self.emit("const int bat = get_global_id(2);")
            self.emit("A += offA + bat * M * K; C += offC + bat * M * N;")
        else:
            self.emit("const int grp = get_global_id(2), bat = grp;")
            self.emit("A += offA; C += offC;")
        if s.pack_b:
            self.emit(f"B += offB + bat * K * (((N + {t.tile_n - 1}) / {t.tile_n}) * {t.tile_n})"
                      f" + (bn / {t.tile_n}) * K * {t.tile_n};")
        else:
            self.emit("B += offB;" if s.kind == "conv" else "B += offB + bat * K * N;")
        self.emit("bias += offBias;")
        for i in range(t.rm):
            for gi in range(ng):
                self.emit(f"{tv} acc{i}_{gi} = ({tv})(0.0f);")
        if t.local:
            self.render_local_loop(tv, ng)
        else:
            self.render_direct_loop(tv, ng)
        self.render_store(ng)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def col_expr(self, gi: int, v: int) -> str:
        t = self.t
        return f"bn + {gi * t.wg_n * t.vw} + lid_n * {t.vw} + {v}"

    def fma_block(self, tv: str, ng: int, ind: int) -> None:
        for i in range(self.t.rm):
            for gi in range(ng):
                a = f"a{i}" if tv == "float" else f"({tv})(a{i})"
                self.emit(f"acc{i}_{gi} = fma({a}, b{gi}, acc{i}_{gi});", ind)

    def direct_step(self, kexpr: str, tv: str, ng: int, ind: int) -> None:
        s, t = self.s, self.t
        self.emit("{", ind)
        self.k_prep(kexpr, "tk", ind + 1)
        for i in range(t.rm):
            self.emit(f"const float a{i} = {self.a_load(f'ra{i}', kexpr, 'tk')};", ind + 1)
        for gi in range(ng):
            if s.vector_b:
                ldb = str(t.tile_n) if s.pack_b else "N"
                load = (f"vload_half{t.vw}(0, B + ({kexpr}) * {ldb} + cb{gi}_0)" if s.in_type == "half"
                        else f"vload{t.vw}(0, B + ({kexpr}) * {ldb} + cb{gi}_0)")
                self.emit(f"const {tv} b{gi} = {load};", ind + 1)
            else:
                parts = [self.b_load(f"cb{gi}_{v}", kexpr) for v in range(t.vw)]
                val = parts[0] if t.vw == 1 else f"({tv})({', '.join(parts)})"
                self.emit(f"const {tv} b{gi} = {val};", ind + 1)
        self.fma_block(tv, ng, ind + 1)
        self.emit("}", ind)

    def render_direct_loop(self, tv: str, ng: int) -> None:
        s, t = self.s, self.t
        for i in range(t.rm):
            self.a_row_setup(f"ra{i}", f"bm + {i * t.wg_m} + lid_m", 1)
        for gi in range(ng):
            for v in range(t.vw if not s.vector_b else 1):
                if s.pack_b:  # column within the packed panel
                    self.emit(f"const int cb{gi}_{v} = {gi * t.wg_n * t.vw} + lid_n * {t.vw} + {v};")
                else:
                    self.b_col_setup(f"cb{gi}_{v}", self.col_expr(gi, v), 1)
        self.emit("int k = 0;")
        self.emit(f"for (; k + {t.tile_k} <= K; k += {t.tile_k}) {{")
        for u in range(t.tile_k):
            self.direct_step(f"k + {u}", tv, ng, 2)
        self.emit("}")
        if not s.even_k:
            self.emit("for (; k < K; ++k)")
            self.direct_step("k", tv, ng, 1)

    def render_local_loop(self, tv: str, ng: int) -> None:
        s, t = self.s, self.t
        wg = t.work_group_size
        tm, tn, tk = t.tile_m, t.tile_n, t.tile_k
        self.emit(f"__local float As[{tk * tm}];")
        self.emit(f"__local float Bs[{tk * tn}];")
        self.emit(f"const int lid = lid_m * {t.wg_n} + lid_n;")
        m_fast = s.kind == "gemm" and s.trans_a
        for u in range(tm * tk // wg):
            e = f"(lid + {u * wg})"
            r, kk = (f"{e} % {tm}", f"{e} / {tm}") if m_fast else (f"{e} / {tk}", f"{e} % {tk}")
            self.emit(f"const int la{u}_r = {r}, la{u}_k = {kk};")
            self.a_row_setup(f"la{u}", f"bm + la{u}_r", 1)
        n_fast = s.kind == "gemm" and not s.trans_b
        for u in range(tn * tk // wg):
            e = f"(lid + {u * wg})"
            c, kk = (f"{e} % {tn}", f"{e} / {tn}") if n_fast else (f"{e} / {tk}", f"{e} % {tk}")
            self.emit(f"const int lb{u}_c = {c}, lb{u}_k = {kk};")
            self.b_col_setup(f"lb{u}", f"bn + lb{u}_c", 1)
        self.emit(f"for (int k0 = 0; k0 < K; k0 += {tk}) {{")
        for u in range(tm * tk // wg):
            kexpr = f"k0 + la{u}_k"
            self.k_prep(f"min({kexpr}, K - 1)" if not s.even_k else kexpr, f"ta{u}", 2)
            val = self.a_load(f"la{u}", kexpr, f"ta{u}")
            if not s.even_k:
                val = f"({kexpr} < K ? {val} : 0.0f)"
            self.emit(f"As[la{u}_k * {tm} + la{u}_r] = {val};", 2)
        for u in range(tn * tk // wg):
            kexpr = f"k0 + lb{u}_k"
            val = self.b_load(f"lb{u}", kexpr)
            if not s.even_k:
                val = f"({kexpr} < K ? {val} : 0.0f)"
            self.emit(f"Bs[lb{u}_k * {tn} + lb{u}_c] = {val};", 2)
        self.emit("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.emit("#pragma unroll", 2)
        self.emit(f"for (int kk = 0; kk < {tk}; ++kk) {{", 2)
        for i in range(t.rm):
            self.emit(f"const float a{i} = As[kk * {tm} + {i * t.wg_m} + lid_m];", 3)
        for gi in range(ng):
            off = f"kk * {tn} + {gi * t.wg_n * t.vw} + lid_n * {t.vw}"
            val = f"Bs[{off}]" if t.vw == 1 else f"vload{t.vw}(0, Bs + {off})"
            self.emit(f"const {tv} b{gi} = {val};", 3)
        self.fma_block(tv, ng, 3)
        self.emit("}", 2)
        self.emit("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.emit("}")

    def render_store(self, ng: int) -> None:
        s, t = self.s, self.t
        g = self.conv
        for i in range(t.rm):
            self.emit(f"const int m{i} = bm + {i * t.wg_m} + lid_m;")
            if s.kind == "gemm" or g.nhwc:  # type: ignore[union-attr]
                ldc = "N" if s.kind == "gemm" else str(g.k)  # type: ignore[union-attr]
                coff = "" if s.kind == "gemm" else f" + grp * {g.kg}"  # type: ignore[union-attr]
                self.emit(f"const int rc{i} = m{i} * {ldc}{coff};")
            else:
                pq = g.p * g.q  # type: ignore[union-attr]
                self.emit(f"const int rc{i} = (m{i} / {pq}) * {g.k * pq} + (m{i} % {pq}) + grp * {g.kg * pq};")  # type: ignore[union-attr]
        cstride = "" if (s.kind == "gemm" or g.nhwc) else f" * {g.p * g.q}"  # type: ignore[union-attr]
        bias_ch = "" if s.kind == "gemm" else f"grp * {g.kg} + "  # type: ignore[union-attr]
        for gi in range(ng):
            for v in range(t.vw):
                n = f"n{gi}_{v}"
                self.emit(f"const int {n} = {self.col_expr(gi, v)};")
                if s.epilogue.has_bias:
                    nb = n if s.even_n else f"min({n}, N - 1)"
                    self.emit(f"const float bias{gi}_{v} = {_load(s.bias_type or 'float', 'bias', bias_ch + nb)};")
        for i in range(t.rm):
            for gi in range(ng):
                comps = []
                for v in range(t.vw):
                    acc = f"acc{i}_{gi}" if t.vw == 1 else f"acc{i}_{gi}.s{_COMPONENTS[v]}"
                    comps.append(epilogue_cl.apply(s.epilogue, acc, f"bias{gi}_{v}"))
                if s.vector_c:
                    vec = f"(float{t.vw})({', '.join(comps)})"
                    dst = f"rc{i} + n{gi}_0"
                    store = (f"vstore_half{t.vw}_rte({vec}, 0, C + {dst});" if s.out_type == "half"
                             else f"vstore{t.vw}({vec}, 0, C + {dst});")
                    self.emit((f"if (m{i} < M) " if not s.even_m else "") + store)
                    continue
                for v, val in enumerate(comps):
                    idx = f"rc{i} + n{gi}_{v}{cstride}"
                    store = (f"vstore_half_rte({val}, {idx}, C);" if s.out_type == "half"
                             else f"C[{idx}] = {val};")
                    guard = []
                    if not s.even_m:
                        guard.append(f"m{i} < M")
                    if not s.even_n:
                        guard.append(f"n{gi}_{v} < N")
                    self.emit((f"if ({' && '.join(guard)}) " if guard else "") + store)


def render(spec: KernelSpec) -> str:
    """OpenCL C source of the kernel ``spec.kernel_name`` for ``spec``."""
    problems = spec.tiling.problems()
    if spec.pack_b and spec.tiling.local:
        problems.append("packed B panels serve direct kernels only (local=0)")
    if problems:
        raise ValueError("; ".join(problems))
    return _Renderer(spec).render()
