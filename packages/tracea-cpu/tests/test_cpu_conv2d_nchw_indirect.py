"""The NCHW path of the indirect conv2d against float64: the input's NHWC copy made image by image inside
the conv's parallel region (``tr_xcopy``: 16 pixels x all channels per sub-task for C <= 64, 16 channels
x all pixels otherwise, channel counts that are not multiples of 16), and the staged NCHW output stores
that keep a full buffer's pixels past the last 64-byte boundary for the next store (chunks of many
tiles, outputs whose start is 4, 8 or 12 bytes past a 64-byte boundary), with two and three threads,
grouped convs (the copy is made by the first group), an epilogue, several K blocks and NaN / Inf."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import BEST, HAVE_CC, config, conv2d_ref, epilogue_ref, rand, rel_err, run_variant
from tracea_cpu.variants import CpuConv2dVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

#: register tiles of this CPU's best ISA: its default GEMM hero and its last one (AVX-512: 6x64 and 4x64;
#: AVX2: 6x16 and 4x24), so the cases run wherever the tests do
TILES = {"first": (GEMM_HEROES[BEST][0]["mr"], GEMM_HEROES[BEST][0]["nr"]),
         "last": (GEMM_HEROES[BEST][-1]["mr"], GEMM_HEROES[BEST][-1]["nr"])}

# (n, c, h, w, k, groups, tile, kc, threads)
CASES = [(3, 20, 33, 29, 40, 1, "first", 1024, 2),    # C <= 64: pixel sub-tasks; 40 channels: an edge panel
         (2, 80, 21, 22, 64, 1, "first", 1024, 3),    # C = 80: channel strips 16 x 5
         (2, 130, 12, 17, 50, 1, "last", 576, 2),     # 130 channels: a 2-channel strip, 3 K blocks
         (4, 32, 30, 30, 48, 2, "first", 1024, 2),    # groups: the first group's region makes the copy
         (1, 64, 56, 56, 64, 1, "first", 1024, 2)]    # the ResNet layer


def _out_at(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A NaN-filled float32 array of ``shape`` starting ``offset`` floats past a 64-byte boundary."""
    size = int(np.prod(shape))
    buf = np.full(size + 32, np.nan, dtype=np.float32)
    start = (-(buf.ctypes.data // 4)) % 16 + offset
    return buf[start:start + size].reshape(shape)


@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}@{c[2]}x{c[3]}-k{c[4]}-g{c[5]}")
def test_nchw_indirect_matches_float64(case, offset):
    n, c, h, w, k, g, tile, kc, threads = case
    mr, nr = TILES[tile]
    epi = "bias+relu" if offset == 1 else "none"
    op = Conv2dOp(n, c, h, w, k, 3, 3, padding=1, groups=g, layout="nchw", epilogue=epi)
    rng = np.random.default_rng(n * c + offset)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    bias = rand(rng, op.k) if op.epilogue.has_bias else None
    out = _out_at(op.out_shape, offset)
    cfg = config(mr=mr, nr=nr, mc=8 * mr, nc=4096, kc=kc, indirect=1, threads=threads)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[BEST]), op, cfg, {"x": x, "w": wt, "bias": bias}, out)
    ref = epilogue_ref(conv2d_ref(x, wt, op), op.epilogue.steps, bias, axis=1)
    assert rel_err(out, ref) < 1e-5


def test_nchw_indirect_nonfinite():
    op = Conv2dOp(3, 24, 31, 27, 32, 3, 3, padding=1, layout="nchw", epilogue="bias+silu")
    rng = np.random.default_rng(11)
    x, wt, bias = rand(rng, *op.x_shape), rand(rng, *op.w_shape), rand(rng, op.k)
    inject_nonfinite(rng, x, 5)
    inject_nonfinite(rng, wt, 2)
    out = _out_at(op.out_shape, 2)
    mr, nr = TILES["first"]
    cfg = config(mr=mr, nr=nr, mc=8 * mr, nc=4096, kc=1024, indirect=1, threads=2)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[BEST]), op, cfg, {"x": x, "w": wt, "bias": bias}, out)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(conv2d_ref(x, wt, op), op.epilogue.steps, bias, axis=1)
    assert nonfinite_mismatch(out, ref) is None
