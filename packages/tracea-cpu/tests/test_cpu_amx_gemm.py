"""AMX bf16 GEMM (``cpu.gemm.amxbf16``) against a float64 reference of the bf16 inputs: odd and tiny
shapes (M = 1; M, N, K not multiples of 16 / 32 / 64; odd K), transposes, batches, every epilogue, both
output dtypes, every tile block and small cache blocks (several K blocks: partial sums; the few-rows
driver), NaN / Inf placement, and the OS permission refusal path. Skipped, with the reason, where the
CPU lacks AMX-BF16 or the OS refuses tile data."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.errors import BackendError
from tracea.ir.ops import GemmOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import amx as amx_mod
from tracea_cpu.amx import CpuGemmAmxVariant, amx_permission
from tracea_cpu.emit.amx import AMX_TILES, check_amx_tile
from tracea_cpu.spaces import AMX_HEROES
from tracea_cpu.testing import AMX_PROFILE, HAVE_CC, PROFILE, config, epilogue_ref, rel_err, run_bf16_gemm

torch = pytest.importorskip("torch")
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

HAVE_AMX = PROFILE.has("amx_tile", "amx_bf16")
needs_amx = [pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
             pytest.mark.skipif(not HAVE_AMX, reason="this CPU lacks AMX-BF16 (amx_tile, amx_bf16)"),
             pytest.mark.skipif(HAVE_AMX and amx_permission() is not None,
                                reason=f"the OS refuses AMX tile data: {amx_permission() if HAVE_AMX else ''}")]
VARIANT = CpuGemmAmxVariant()
SHAPES = [(1, 1, 1), (1, 33, 129), (7, 7, 7), (33, 1, 7), (17, 33, 65), (33, 129, 129), (97, 131, 257),
          (2, 97, 3), (13, 61, 1), (64, 64, 64), (31, 47, 95), (65, 17, 33)]


def amx_case(m, n, k, **kw):
    """Relative error of a bf16 GEMM through the AMX variant (:func:`~tracea_cpu.testing.run_bf16_gemm`)."""
    res, ref = run_bf16_gemm(VARIANT, m, n, k, **kw)
    return rel_err(res.float().numpy(), ref)


def _tol(out: str) -> float:
    return 1e-5 if out == "float32" else 1e-2


def test_tile_blocks_are_checked():
    for mr, nr in AMX_TILES:
        assert check_amx_tile(mr, nr) is None
    assert "tile registers" in check_amx_tile(32, 64)
    assert "whole 16 x 16 tiles" in check_amx_tile(24, 32)
    bad = config(mr=32, nr=48, mc=64, nc=96, kc=64, threads=0)
    assert not VARIANT.validate_config(GemmOp(8, 8, 8, dtype_a="bf16", dtype_b="bf16"), bad, PROFILE)


def test_declines_with_the_os_reason_when_refused(monkeypatch):
    """A refused XTILEDATA request makes the variant decline (the AVX512_BF16 variant serves) and a
    direct build raise BackendError, with the OS's reason."""
    monkeypatch.setattr(amx_mod, "amx_permission", lambda: "the OS refused AMX tile data (test)")
    op = GemmOp(32, 32, 32, dtype_a="bf16", dtype_b="bf16")
    reasons = VARIANT.check(op, AMX_PROFILE)
    assert any("refused AMX tile data" in r for r in reasons)
    with pytest.raises(BackendError, match="refused"):
        VARIANT.library(32, 32, "")


def test_declines_when_the_compiler_cannot_build_amx(monkeypatch):
    monkeypatch.setattr(amx_mod, "amx_compiler_reason", lambda kind="bf16": "the C compiler cannot build AMX (test)")
    op = GemmOp(32, 32, 32, dtype_a="bf16", dtype_b="bf16")
    reasons = VARIANT.check(op, AMX_PROFILE)
    assert any("cannot build AMX" in r for r in reasons)


def test_cpu_without_amx_is_declined():
    op = GemmOp(32, 32, 32, dtype_a="bf16", dtype_b="bf16")
    no_amx = PROFILE.with_(isa=tuple(f for f in PROFILE.isa if not f.startswith("amx")))
    assert any("needs AMX" in r for r in VARIANT.check(op, no_amx))


@pytest.mark.parametrize("out", ["float32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_amx_shapes(shape, out):
    _skip_without_amx()
    assert amx_case(*shape, out=out) < _tol(out)


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_amx_transposes(ta, tb, out):
    _skip_without_amx()
    for shape in [(17, 33, 65), (64, 48, 40), (5, 70, 33), (40, 16, 48), (1, 50, 63)]:
        assert amx_case(*shape, ta=ta, tb=tb, out=out) < _tol(out), shape


@pytest.mark.parametrize("epi", ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_amx_epilogues(epi, out):
    _skip_without_amx()
    for shape in [(17, 33, 65), (40, 64, 33), (1, 70, 100)]:
        assert amx_case(*shape, epi=epi, out=out, seed=3) < _tol(out), (epi, shape)


@pytest.mark.parametrize("bias_dtype", ["float32", "bfloat16"])
def test_amx_bias_in_fp32_or_bf16(bias_dtype):
    _skip_without_amx()
    assert amx_case(23, 45, 37, epi="bias+relu", bias_dtype=bias_dtype, out="bf16") < 1e-2
    assert amx_case(23, 45, 37, epi="bias", bias_dtype=bias_dtype) < 1e-5


@pytest.mark.parametrize("tile", AMX_TILES)
def test_amx_every_tile_block_and_small_cache_blocks(tile):
    """Every MR x NR block; kc = 32 (several K blocks: partial sums, the bf16 output through the fp32
    workspace), mc / nc of two blocks, 2 threads, batches, the few-rows driver (transposed B)."""
    _skip_without_amx()
    mr, nr = tile
    for kc in (32, 2048):
        cfg = config(mr=mr, nr=nr, mc=2 * mr, nc=2 * nr, kc=kc, threads=2)
        for shape in [(5 * mr + 3, 3 * nr + 5, 61), (2 * mr, 2 * nr, 32), (mr - 1, nr + 1, 17), (1, 300, 129)]:
            for tb in (False, True):
                for out in ("float32", "bf16"):
                    err = amx_case(*shape, cfg=cfg, tb=tb, epi="bias+gelu_tanh", out=out, batch=2)
                    assert err < _tol(out), (tile, kc, shape, tb, out)


@pytest.mark.parametrize("hero", range(len(AMX_HEROES)))
def test_amx_every_hero(hero):
    _skip_without_amx()
    cfg = config(**AMX_HEROES[hero], threads=0)
    assert amx_case(53, 101, 77, cfg=cfg, epi="silu") < 1e-5
    assert amx_case(300, 257, 601, cfg=cfg, epi="bias", out="bf16", tb=True) < 1e-2


def test_amx_large_and_decode_shapes():
    _skip_without_amx()
    assert amx_case(300, 257, 601, epi="bias") < 1e-5
    for m in (1, 8, 17):
        assert amx_case(m, 512, 1024, tb=True, epi="bias", out="bf16") < 1e-2


@pytest.mark.parametrize("m,n,k", [(33, 64, 32), (48, 40, 96), (65, 64, 32), (80, 100, 288), (97, 33, 512), (113, 70, 1024), (128, 96, 320),
                                   (128, 31, 256), (100, 64, 100)])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_amx_few_rows_k_chunks(m, n, k, out):
    """33-128 tokens against transposed weights: whole 32-row blocks run K in chunks of 8 steps with the
    token slices' partial sums stored between chunks (a K of 1-40 steps: one chunk, a partial last
    chunk, several); an N edge block and a K that is no multiple of 32 take the whole-K blocks."""
    _skip_without_amx()
    for seed in (0, 1):
        assert amx_case(m, n, k, tb=True, epi="bias+gelu_tanh", out=out, seed=seed) < _tol(out), (m, n, k, seed)


@pytest.mark.parametrize("m,n,out", [(1030, 2048, "bf16"), (1030, 2064, "bf16"), (1030, 1024, "float32"),
                                     (1030, 1040, "float32")])
def test_amx_large_outputs_streaming_stores(m, n, out):
    """Outputs of 4 MiB and more are written with streaming stores where whole aligned cache lines are
    (emit/amx_blocks.py): N a multiple of 32, and with a last block of 16 or 32 columns that is not."""
    _skip_without_amx()
    assert amx_case(m, n, 40, epi="bias+relu", out=out, seed=5) < _tol(out)


def test_amx_block_rows_fit_twice_the_l2():
    """The many-rows driver packs mc x K of A: mc is lowered for a deep K (A block within twice the L2,
    whole tile rows, at least one), never raised, and left alone without a known L2."""
    cfg = config(mr=32, nr=32, mc=256, nc=256, kc=256, threads=0)
    two_mb = PROFILE.with_(caches={"L2": 2 << 20})
    rows = {k: VARIANT.block_rows(GemmOp(4096, 4096, k, dtype_a="bf16", dtype_b="bf16"), cfg, two_mb)
            for k in (512, 4096, 8192, 16384, 100000)}
    assert rows == {512: 256, 4096: 256, 8192: 256, 16384: 128, 100000: 32}
    assert VARIANT.block_rows(GemmOp(64, 64, 4096, dtype_a="bf16", dtype_b="bf16"), cfg,
                              PROFILE.with_(caches={})) == 256


@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_amx_whole_b_limit_takes_the_blocked_driver(out):
    """A B larger than TB_AMX_MAX_B_BYTES is not packed whole: the blocked driver (KC x NC blocks, the
    bf16 output's partial sums through the fp32 workspace) runs instead. Built here with the limit at 0
    so that every many-rows GEMM takes it."""
    _skip_without_amx()
    from tracea.ir.epilogue import Epilogue
    from tracea_cpu.emit.amx import amx_gemm_source
    from tracea_cpu.isa import AMX_BF16, AVX512
    from tracea_cpu.kernels import _bind_tb_gemm
    from tracea_cpu.toolchain import build

    lib = _bind_tb_gemm(build(amx_gemm_source(AVX512, 32, 32, Epilogue.parse("bias")),
                              AMX_BF16.cflags + ("-DTB_AMX_MAX_B_BYTES=0",), "gemm-amx-test-noblocks"))
    g = torch.Generator().manual_seed(11)
    for m, n, k in [(300, 257, 601), (64, 96, 40), (257, 33, 1000)]:
        a, b = torch.randn(m, k, generator=g).bfloat16(), torch.randn(k, n, generator=g).bfloat16()
        bias = torch.randn(n, generator=g)
        res = torch.full((m, n), float("nan"), dtype=torch.bfloat16 if out == "bf16" else torch.float32)
        rc = lib.tb_gemm(1, m, n, k, a.data_ptr(), k, 1, m * k, b.data_ptr(), n, 1, k * n, res.data_ptr(), n,
                         m * n, int(out == "bf16"), bias.data_ptr(), 64, 64, 64, 2)
        assert rc == 0
        ref = a.double().numpy() @ b.double().numpy() + bias.double().numpy()
        assert rel_err(res.float().numpy(), ref) < _tol(out), (m, n, k)


def test_amx_matches_fp32_output_rounded():
    """The bf16 output is the round-to-nearest-even of the fp32 output (same config, same order)."""
    _skip_without_amx()
    g = torch.Generator().manual_seed(7)
    a = torch.randn(37, 129, generator=g).bfloat16()
    b = torch.randn(129, 70, generator=g).bfloat16()
    outs = {}
    for out in ("float32", "bf16"):
        op = GemmOp(37, 70, 129, epilogue="gelu_erf", dtype_a="bf16", dtype_b="bf16", dtype_out=out)
        res = torch.empty(37, 70, dtype=torch.float32 if out == "float32" else torch.bfloat16)
        VARIANT.run(op, config(**AMX_HEROES[0], threads=1), OpArgs({"a": a, "b": b, "bias": None}, res,
                                                                   TorchAdapter()), PROFILE)
        outs[out] = res
    assert torch.equal(outs["float32"].bfloat16().view(torch.int16), outs["bf16"].view(torch.int16))


@pytest.mark.parametrize("out_dtype", ["float32", "bf16"])
@pytest.mark.parametrize("m,n,k,tb,cfg", [
    (37, 70, 29, False, None), (23, 45, 61, True, dict(mr=32, nr=32, mc=64, nc=64, kc=32, threads=2)),
    (5, 300, 40, True, dict(mr=16, nr=64, mc=128, nc=512, kc=2048, threads=2))])
def test_amx_random_nonfinite(out_dtype, m, n, k, tb, cfg):
    """NaN / +-Inf at random positions of A, B or the bias land where the float64 reference puts them."""
    _skip_without_amx()
    rng = np.random.default_rng([m, n, k, len(out_dtype)])
    for trial, epi in enumerate(["none", "bias+relu", "relu", "gelu_tanh", "bias+gelu_erf", "silu"] * 2):
        op = GemmOp(m, n, k, trans_b=tb, epilogue=epi, dtype_a="bf16", dtype_b="bf16", dtype_out=out_dtype)
        a = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).bfloat16()
        b = torch.from_numpy(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)).bfloat16()
        bias = None
        if op.epilogue.has_bias:
            bias = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).to(
                torch.bfloat16 if trial % 2 else torch.float32)
        targets = [a, b] + ([bias] if bias is not None else [])
        injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1) for _ in range(1 + trial % 3)]
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16 if out_dtype == "bf16" else torch.float32)
        c = config(**cfg) if cfg else VARIANT.hero_configs(op, PROFILE)[0]
        VARIANT.run(op, c, OpArgs({"a": a, "b": b, "bias": bias}, out, TorchAdapter()), PROFILE)
        a64, b64 = a.double().numpy(), b.double().numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            ref = epilogue_ref(a64 @ (b64.T if tb else b64), op.epilogue.steps,
                               None if bias is None else bias.double().numpy(), axis=1)
        msg = nonfinite_mismatch(out.float().numpy(), ref, atol=_tol(out_dtype))
        assert msg is None, f"{(m, n, k, tb)} {epi} -> {out_dtype}, injected {injected}: {msg}"


def test_doctor_picks_amx_for_large_bf16_gemm_through_public_matmul():
    """``tracea.ops.matmul`` on bf16 torch tensors runs the AMX variant (the Doctor's pick) correctly."""
    _skip_without_amx()
    import tracea
    from tracea.doctor.doctor import get_doctor

    op = GemmOp(512, 512, 512, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
    assert get_doctor().decide(op, PROFILE.device, use_cache=False).chosen.variant.name == "cpu.gemm.amxbf16"
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(130, 70, generator=g).bfloat16(), torch.randn(70, 90, generator=g).bfloat16()
    got = tracea.ops.matmul(a, b)
    ref = a.double() @ b.double()
    assert got.dtype == torch.bfloat16 and rel_err(got.float().numpy(), ref.numpy()) < 1e-2


def _skip_without_amx() -> None:
    for mark in needs_amx:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])


@pytest.mark.parametrize("tb", [False, True])
def test_user_path_keeps_b_panels_and_sees_in_place_updates(tb):
    """``tracea.ops.matmul`` through the many-rows driver keeps a torch B's packed panels between calls
    (one cache entry) and packs again after an in-place update of B (its version counter moves)."""
    import tracea
    from tracea_cpu.panel_cache import PANELS

    for mark in needs_amx:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    PANELS.clear()
    g = torch.Generator().manual_seed(21)
    m, n, k = 300, 200, 136
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(n, k, generator=g).bfloat16() if tb else torch.randn(k, n, generator=g).bfloat16()
    bt = b.t() if tb else b

    def check():
        got = tracea.ops.matmul(a, bt).double().numpy()
        ref = a.double().numpy() @ bt.double().numpy()
        assert rel_err(got, ref) < 1e-2

    check()
    check()
    check()
    assert len(PANELS) == 1
    with torch.no_grad():
        b.mul_(-3).add_(1)
    check()
    check()
    check()
    assert len(PANELS) == 1
    b2 = b.clone()
    with torch.no_grad():
        b2[:5].zero_()
    bt = b2.t() if tb else b2
    check()
