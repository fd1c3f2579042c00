"""The direct NCHW conv2d (``indirect=3``: output pixels in the vector lanes, input read in place, tiles
stored straight into the NCHW output) against float64, for each ISA with the kernel (AVX-512: 16-pixel
vectors, 3 x 8 tiles; AVX2: 8-pixel vectors, 2 x 6 tiles) that this machine runs (the other skips with
the reason): odd image sizes, channel counts that are not multiples of the vector and output-channel
counts that are not multiples of the channel block, every padding with output rows as wide as the
input's (1x1 / 3x3 / 5x5 / 7x7, 1x3 / 3x1, dilation, P != H), images smaller than one vector, rows as
wide as a vector or a few, the evened-out last tiles, outputs 4-60 bytes past a 64-byte boundary, one to
three threads, batches, epilogues, NaN / Inf (nothing is skipped over padding: 0 x Inf = NaN as in
PyTorch), the fallback to the indirect algorithm where the direct one does not apply, compile-only checks
of both ISAs' C text, and the hero choice."""

from __future__ import annotations

import dataclasses
import subprocess

import numpy as np
import pytest

from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Conv2dOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import spaces
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.testing import HAVE_CC, ISAS, PROFILE, config, conv2d_ref, epilogue_ref, rand, rel_err, run_variant
from tracea_cpu.toolchain import BASE_FLAGS, compiler_or_reason
from tracea_cpu.variants import CpuConv2dVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")


def _isa_param(name: str):
    return pytest.param(name, id=name, marks=pytest.mark.skipif(
        name not in ISAS, reason=f"this machine cannot run {name} (its direct kernel is compile-checked only)"))


#: ISAs with a direct NCHW kernel, as test parameters (skipped where this machine cannot run them).
DIRECT = [_isa_param(n) for n in spaces.DIRECT_NCHW_ISAS]


def _cfg(isa: str, algo: int = 3, threads: int = 2):
    """The ISA's first GEMM hero with the conv algorithm ``algo`` (for the direct one the tile only
    names the library)."""
    hero = spaces.GEMM_HEROES[isa][0]
    return config(**dict(hero, indirect=algo, threads=threads))


# (n, c, h, w, k, (r, s), padding, dilation, threads)
CASES = [(2, 20, 33, 29, 40, (3, 3), (1, 1), 1, 2),     # odd sizes, 20 channels, 40 = 5 blocks of 8 / 7 of 6
         (3, 13, 17, 23, 11, (3, 3), (1, 1), 1, 3),     # 11 outputs: a partial channel block
         (1, 64, 56, 56, 64, (3, 3), (1, 1), 1, 2),     # the ResNet layer (AVX-512: 3 + 1 vectors -> 2 + 2)
         (2, 24, 14, 14, 32, (3, 3), (1, 1), 1, 1),     # 196 pixels: 13 / 25 vectors, one thread
         (2, 9, 19, 21, 16, (5, 5), (2, 2), 1, 2),      # 5x5, padding 2
         (2, 16, 15, 13, 24, (1, 1), (0, 0), 1, 2),     # 1x1, padding 0
         (1, 12, 20, 18, 8, (3, 3), (2, 2), 2, 2),      # dilation 2, padding 2
         (2, 8, 12, 11, 16, (3, 3), (0, 1), 1, 2),      # P = H - 2 (no row padding)
         (2, 8, 9, 10, 16, (3, 3), (2, 1), 1, 2),       # P = H + 2 (output rows of padding only)
         (2, 17, 1, 1, 9, (3, 3), (1, 1), 1, 2),        # one pixel: every tap but the centre is padding
         (3, 10, 3, 5, 12, (3, 3), (1, 1), 1, 2),       # 15 pixels: less than one 16-pixel vector
         (1, 32, 7, 7, 64, (3, 3), (1, 1), 1, 2),       # 49 pixels: AVX-512 4 vectors as 2 + 2, AVX2 7 as 2 + 2 + 2 + 1
         (2, 5, 2, 3, 7, (3, 3), (1, 1), 1, 2),         # 6 pixels: less than one 8-pixel vector
         (2, 16, 8, 8, 12, (3, 3), (1, 1), 1, 2),       # rows of one 8-pixel vector
         (1, 16, 9, 16, 20, (3, 3), (1, 1), 1, 2),      # rows of two 8-pixel vectors / one 16-pixel vector
         (2, 8, 11, 24, 8, (3, 3), (1, 1), 1, 2),       # rows of three 8-pixel vectors (tiles across row ends)
         (1, 24, 10, 9, 13, (3, 3), (1, 1), 1, 2),      # 90 pixels: 12 vectors of 8 (a masked last store)
         (2, 6, 13, 17, 10, (7, 7), (3, 3), 1, 2),      # 7x7, padding 3 (taps reach 3 rows / columns out)
         (2, 7, 11, 12, 9, (1, 3), (0, 1), 1, 2),       # 1x3
         (2, 7, 11, 12, 9, (3, 1), (1, 0), 1, 2),       # 3x1 (rows only)
         (1, 10, 16, 15, 8, (3, 3), (3, 3), 3, 3),      # dilation 3, padding 3
         (1, 11, 14, 13, 17, (3, 3), (0, 2), 2, 2),     # dilation 2, no row padding (P = H - 4)
         (4, 3, 23, 31, 16, (3, 3), (1, 1), 1, 3),      # 3 input channels, batch 4, three threads
         (2, 128, 14, 14, 40, (3, 3), (1, 1), 1, 2),    # 128 channels: two parts of 64 channels per tap row on AVX2
         (1, 130, 9, 10, 14, (3, 3), (1, 1), 1, 2),     # 130 channels: AVX2 parts of 44 + 44 + 42
         (1, 20, 12, 13, 100, (3, 3), (1, 1), 1, 2),    # 100 outputs: AVX2 17 blocks in two groups (9 + 8)
         (1, 70, 6, 7, 200, (1, 1), (0, 0), 1, 3)]      # 1x1, 200 outputs: AVX2 34 blocks in 12 + 12 + 10, 35 + 35 channels


def _out_at(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A NaN-filled float32 array of ``shape`` starting ``offset`` floats past a 64-byte boundary."""
    size = int(np.prod(shape))
    buf = np.full(size + 32, np.nan, dtype=np.float32)
    start = (-(buf.ctypes.data // 4)) % 16 + offset
    return buf[start:start + size].reshape(shape)


def _run(isa: str, op: Conv2dOp, seed: int, offset: int = 0, threads: int = 2, nonfinite: bool = False,
         algo: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    bias = rand(rng, op.k) if op.epilogue.has_bias else None
    if nonfinite:
        inject_nonfinite(rng, x, 4)
        inject_nonfinite(rng, wt, 2)
    x_in, w_in = x.copy(), wt.copy()
    out = _out_at(op.out_shape, offset)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[isa]), op, _cfg(isa, algo, threads), {"x": x, "w": wt, "bias": bias},
                out)
    assert np.array_equal(x, x_in, equal_nan=True) and np.array_equal(wt, w_in, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(conv2d_ref(x, wt, op), op.epilogue.steps, bias, axis=1)
    return out, ref


EPIS = {0: "none", 1: "bias+relu", 15: "bias", 7: "bias+silu"}


@pytest.mark.parametrize("isa", DIRECT)
@pytest.mark.parametrize("offset", [0, 1, 7, 15])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}@{c[2]}x{c[3]}-k{c[4]}-{c[5][0]}x{c[5][1]}"
                                                       f"-p{c[6][0]}{c[6][1]}-d{c[7]}")
def test_nchw_direct_matches_float64(case, offset, isa):
    n, c, h, w, k, (r, s), pad, dil, threads = case
    op = Conv2dOp(n, c, h, w, k, r, s, padding=pad, dilation=dil, layout="nchw", epilogue=EPIS[offset])
    assert op.q == op.w and spaces.direct_nchw_ok(ISA_BY_NAME[isa], op)
    out, ref = _run(isa, op, n * c + k + offset, offset, threads)
    assert not np.isnan(out).any(), "output left unwritten (NaN poison survived)"
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("isa", DIRECT)
@pytest.mark.parametrize("shape", [(3, 24, 31, 27, 20), (2, 9, 8, 8, 13), (1, 33, 5, 3, 6), (2, 64, 14, 14, 36)],
                         ids=lambda s: f"{s[0]}x{s[1]}@{s[2]}x{s[3]}-k{s[4]}")
def test_nchw_direct_nonfinite(shape, isa):
    n, c, h, w, k = shape
    op = Conv2dOp(n, c, h, w, k, 3, 3, padding=1, layout="nchw", epilogue="bias+silu")
    out, ref = _run(isa, op, 11 + c, offset=2, nonfinite=True)
    assert nonfinite_mismatch(out, ref) is None


@pytest.mark.parametrize("isa", DIRECT)
@pytest.mark.parametrize("tap,row", [((0, 0), 0), ((2, 2), -1), ((0, 2), 0)], ids=["top-left", "bottom-right",
                                                                                 "top-right"])
def test_nchw_direct_inf_weight_over_padding_gives_nan(isa, tap, row):
    """An Inf weight at a corner tap: the border outputs multiply it by the zero padding (NaN)."""
    op = Conv2dOp(1, 8, 9, 11, 8, 3, 3, padding=1, layout="nchw")
    rng = np.random.default_rng(5)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    wt[3, 2, tap[0], tap[1]] = np.inf
    out = _out_at(op.out_shape, 0)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[isa]), op, _cfg(isa), {"x": x, "w": wt, "bias": None}, out)
    with np.errstate(invalid="ignore"):
        ref = conv2d_ref(x, wt, op)
    assert np.isnan(ref[0, 3, row, :]).all()
    assert nonfinite_mismatch(out, ref) is None


@pytest.mark.parametrize("isa", DIRECT)
@pytest.mark.parametrize("op", [Conv2dOp(2, 16, 15, 15, 24, 3, 3, stride=2, padding=1, layout="nchw"),
                                Conv2dOp(2, 16, 12, 12, 32, 3, 3, padding=1, groups=2, layout="nchw"),
                                Conv2dOp(2, 16, 12, 13, 24, 3, 3, padding=0, layout="nchw"),
                                Conv2dOp(2, 16, 12, 13, 24, 3, 3, padding=1, layout="nhwc")],
                         ids=["stride2", "groups2", "narrower-output", "nhwc"])
def test_direct_falls_back_where_it_does_not_apply(op, isa):
    assert not spaces.direct_nchw_ok(ISA_BY_NAME[isa], op)
    out, ref = _run(isa, op, 3)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("isa,expect", [("avx512", 1), ("avx2", 1), ("scalar", 0)])
def test_direct_kernel_compiles_where_expected(isa, expect, tmp_path):
    """Compile-only (nothing runs, so AVX-512 is checked on any x86 host): the blocked library's C text
    with the ISA's flags has the direct kernel (``TR_HAVE_ND``) exactly where expected, warning-free."""
    cc, why = compiler_or_reason()
    if cc is None:
        pytest.skip(why)
    if not ISA_BY_NAME[isa].runs_here():
        pytest.skip(f"{isa} code is not compiled on this architecture")
    mr, nr = spaces.GEMM_HEROES[isa][0]["mr"], spaces.GEMM_HEROES[isa][0]["nr"]
    src = blocked_source(ISA_BY_NAME[isa], mr, nr, Epilogue.parse("bias+relu"))
    src += f"\n#if TR_HAVE_ND != {expect}\n#error TR_HAVE_ND is not {expect}\n#endif\n"
    (tmp_path / "k.c").write_text(src)
    flags = [f for f in BASE_FLAGS if f != "-shared"] + list(ISA_BY_NAME[isa].cflags) + (["-fopenmp"] if cc.openmp else []) + ["-Werror"]
    res = subprocess.run([cc.path, *flags, "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_direct_hero_choice(isa):
    """Hero order (configs only, nothing runs): direct first for NCHW layers of at most 64 channels or
    1x1 kernels on enough pixels, else after the indirect heroes; never offered for NHWC or an ISA without
    the kernel."""
    variant = CpuConv2dVariant(ISA_BY_NAME[isa])
    small_c = Conv2dOp(8, 64, 56, 56, 64, 3, 3, padding=1)
    many_c = Conv2dOp(8, 128, 28, 28, 128, 3, 3, padding=1)
    nhwc = dataclasses.replace(small_c, layout="nhwc")
    assert all(h.get("indirect") != 3 for h in variant.hero_configs(nhwc, PROFILE))
    assert 3 not in {c.get("indirect") for c in variant.search_space(nhwc, PROFILE)}
    assert variant.validate_config(small_c, _cfg(isa), PROFILE)
    pointwise = Conv2dOp(8, 512, 28, 28, 128, 1, 1)
    small_image = Conv2dOp(1, 64, 14, 14, 64, 3, 3, padding=1)
    for op, first in ((small_c, 3), (dataclasses.replace(small_c, n=1), 3), (many_c, 1), (pointwise, 3),
                      (small_image, 1), (dataclasses.replace(pointwise, n=1, h=7, w=7), 1)):
        heroes = variant.hero_configs(op, PROFILE)
        assert heroes[0].get("indirect") == first, op
        assert any(h.get("indirect") == 3 for h in heroes) and any(h.get("indirect") == 1 for h in heroes)
    assert 3 in {c.get("indirect") for c in variant.search_space(small_c, PROFILE)}


def test_no_direct_kernel_no_direct_hero():
    variant = CpuConv2dVariant(ISA_BY_NAME["scalar"])
    op = Conv2dOp(8, 64, 56, 56, 64, 3, 3, padding=1)
    assert not spaces.direct_nchw_ok(ISA_BY_NAME["scalar"], op)
    assert all(h.get("indirect") != 3 for h in variant.hero_configs(op, PROFILE))
    assert 3 not in {c.get("indirect") for c in variant.search_space(op, PROFILE)}
