"""AMX bf16 conv2d (``cpu.conv2d.amxbf16``) against a float64 reference of the bf16 inputs: odd shapes
(channels not multiples of 16 / 32, images narrower than a tile, 1x1 and 5x5 kernels), stride, padding,
dilation, groups, NCHW and NHWC, both output dtypes, every epilogue, every tile block and small weight
runs, NaN / Inf placement, the kept weight panels (in-place updates are seen), the user path
``tracea.ops.conv2d`` (the Doctor's pick, aliased outputs rejected, inputs untouched) and the OS refusal
path. Skipped, with the reason, where the CPU lacks AMX-BF16 or the OS refuses tile data."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.errors import BackendError, TraceaError
from tracea.ir.ops import Conv2dOp
from tracea.testing import nonfinite_mismatch
from tracea_cpu import amx as amx_mod
from tracea_cpu import amx_conv as conv_mod
from tracea_cpu.amx import amx_permission
from tracea_cpu.amx_conv import CONV_TILES, CpuConv2dAmxVariant
from tracea_cpu.panel_cache import PANELS
from tracea_cpu.testing import AMX_PROFILE, HAVE_CC, PROFILE, bf16_tol, config, max_rel, run_bf16_conv

torch = pytest.importorskip("torch")
F = torch.nn.functional
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

HAVE_AMX = PROFILE.has("amx_tile", "amx_bf16")
needs_amx = [pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
             pytest.mark.skipif(not HAVE_AMX, reason="this CPU lacks AMX-BF16 (amx_tile, amx_bf16)"),
             pytest.mark.skipif(HAVE_AMX and amx_permission() is not None,
                                reason=f"the OS refuses AMX tile data: {amx_permission() if HAVE_AMX else ''}")]


def amx(fn):
    """Skip ``fn`` with the reason where AMX bf16 kernels cannot run."""
    for mark in needs_amx:
        fn = mark(fn)
    return fn


VARIANT = CpuConv2dAmxVariant()

# (n, C, H, W, K, R, S, stride, padding, dilation, groups)
SHAPES = [(1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1), (2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1), (1, 33, 7, 7, 17, 3, 3, 2, 1, 1, 1),
          (1, 40, 6, 5, 70, 1, 1, 1, 0, 1, 1), (2, 8, 13, 10, 12, 3, 3, 2, 2, 2, 2), (1, 16, 8, 8, 16, 3, 3, 1, 1, 1, 4), (1, 12, 6, 6, 12, 3, 3, 1, 1, 1, 3),
          (3, 40, 5, 6, 70, 2, 2, 1, 0, 1, 1), (1, 32, 12, 12, 48, 5, 5, 3, 2, 1, 1), (1, 7, 20, 20, 9, 3, 3, 1, 3, 3, 1),
          (1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1), (2, 96, 17, 3, 31, 3, 1, (2, 1), (1, 0), (1, 2), 1),
          (1, 24, 4, 4, 18, 3, 3, 1, 1, 1, 3), (2, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1), (1, 50, 33, 2, 33, 1, 2, 1, (0, 1), 1, 1)]


def conv_case(shape, **kw):
    """(output, float64 reference) of the variant on ``shape`` (see :func:`tracea_cpu.testing.run_bf16_conv`); the
    bias float32 unless ``bias_dtype`` says otherwise."""
    return run_bf16_conv(VARIANT, shape, **{"bias_dtype": "float32", **kw})


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("out", ["float32", "bf16"])
@amx
def test_shapes_against_float64(shape, layout, out):
    got, ref = conv_case(shape, layout=layout, out=out, seed=hash((shape, layout, out)) % 1000)
    assert max_rel(got, ref) < bf16_tol(out), (shape, layout, out, max_rel(got, ref))


@pytest.mark.parametrize("epi", ["bias", "relu", "bias+relu", "bias+gelu", "bias+gelu_erf", "silu", "bias+silu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@amx
def test_epilogues(epi, layout):
    for shape in (SHAPES[1], SHAPES[4]):
        for out in ("float32", "bf16"):
            got, ref = conv_case(shape, layout=layout, out=out, epi=epi, seed=7, bias_dtype="bfloat16" if out == "bf16"
                                 else "float32")
            assert max_rel(got, ref) < bf16_tol(out) * 2, (epi, shape, out)


@pytest.mark.parametrize("tile", CONV_TILES)
@pytest.mark.parametrize("wblk,kst,mbg", [(1, 4096, 1), (512, 4096, 1), (512, 1, 3), (2, 24, 8)])
@amx
def test_tile_blocks_weight_runs_and_k_chunks(tile, wblk, kst, mbg):
    """Every tile block; wblk = 1 KiB gives one panel per run (several runs per image block); kst = 1 KiB
    gives one tap per K chunk (partial sums through the scratch), mbg groups of pixel blocks."""
    cfg = config(mr=tile[0], nr=tile[1], wblk=wblk, kst=kst, mbg=mbg, threads=0)
    for shape in (SHAPES[0], SHAPES[2], SHAPES[3], SHAPES[10]):
        for layout in ("NCHW", "NHWC"):
            got, ref = conv_case(shape, layout=layout, cfg=cfg, seed=3)
            assert max_rel(got, ref) < bf16_tol("float32"), (tile, wblk, shape, layout)


@amx
def test_one_thread_and_two_threads_agree():
    op_shape = SHAPES[0]
    a, _ = conv_case(op_shape, cfg=config(mr=32, nr=32, wblk=512, kst=24, mbg=8, threads=1), seed=5)
    b, _ = conv_case(op_shape, cfg=config(mr=32, nr=32, wblk=512, kst=24, mbg=8, threads=2), seed=5)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("seed", range(4))
@amx
def test_nan_inf_propagate_as_the_reference(layout, seed):
    """NaN / Inf in the input and the weights land where the float64 reference puts them (zero padding
    times an Inf weight is NaN, as in PyTorch's reference math)."""
    shape = [SHAPES[1], SHAPES[2], SHAPES[4], SHAPES[0]][seed]
    got, ref = conv_case(shape, layout=layout, seed=seed, nonfinite=2)
    why = nonfinite_mismatch(got, ref, atol=1e-3)
    assert why is None, why


@amx
def test_kept_panels_follow_in_place_updates():
    """The weight panels of a torch tensor are kept from its second unchanged call on, reused while it is
    unchanged and packed again after an in-place update (its version counter moves)."""
    PANELS.clear()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, 20, 9, 9, generator=gen).bfloat16()
    w = torch.randn(24, 20, 3, 3, generator=gen).bfloat16()
    op = Conv2dOp(1, 20, 9, 9, 24, 3, 3, padding=(1, 1), dtype="bf16", dtype_out="float32")
    cfg = VARIANT.hero_configs(op, PROFILE)[0]
    res = torch.empty(op.out_shape)

    def run():
        VARIANT.run(op, cfg, OpArgs({"x": x, "w": w, "bias": None}, res, TorchAdapter()), PROFILE)
        return res.clone()

    first = run()
    assert len(PANELS) == 0  # first sighting: packed into the workspace, nothing kept
    assert torch.equal(run(), first) and len(PANELS) == 1
    assert torch.equal(run(), first) and len(PANELS) == 1
    with torch.no_grad():
        w.mul_(-2)
    ref = F.conv2d(x.double(), w.double(), None, 1, 1).numpy()
    for _ in range(3):
        assert max_rel(run().double().numpy(), ref) < 2e-5
    assert len(PANELS) == 1  # the stale entry of the same tensor went
    w2 = w.clone()
    with torch.no_grad():
        w2[0].zero_()
    ref2 = F.conv2d(x.double(), w2.double(), None, 1, 1).numpy()
    VARIANT.run(op, cfg, OpArgs({"x": x, "w": w2, "bias": None}, res, TorchAdapter()), PROFILE)
    assert max_rel(res.double().numpy(), ref2) < 2e-5


@amx
def test_cache_off_packs_per_call(monkeypatch):
    monkeypatch.setenv("TRACEA_CPU_WEIGHT_CACHE", "0")
    PANELS.clear()
    got, ref = conv_case(SHAPES[0], seed=9)
    assert max_rel(got, ref) < 2e-5 and len(PANELS) == 0


@pytest.mark.parametrize("channels_last", [False, True])
@amx
def test_user_path_picks_amx_and_matches(channels_last):
    import tracea
    from tracea.runtime import fallbacks

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 36, 11, 13, generator=gen).bfloat16()
    w = torch.randn(20, 36, 3, 3, generator=gen).bfloat16()
    b = torch.randn(20, generator=gen).bfloat16()
    if channels_last:
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    x0, w0 = x.clone(), w.clone()
    before = dict(fallbacks.counts())
    y = tracea.ops.conv2d(x, w, b, stride=1, padding=1, activation="relu")
    assert dict(fallbacks.counts()) == before, "fell back to torch"
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), 1, 1))
    assert y.dtype is torch.bfloat16 and y.shape == ref.shape
    assert max_rel(y.double().numpy(), ref.numpy()) < 8e-3
    assert torch.equal(x, x0) and torch.equal(w, w0)
    from tracea.doctor.doctor import get_doctor

    op = Conv2dOp(2, 36, 11, 13, 20, 3, 3, padding=(1, 1), dtype="bf16", dtype_out="bf16",
                  layout="NHWC" if channels_last else "NCHW", epilogue="bias+relu")
    assert get_doctor().decide(op, PROFILE.device, use_cache=False).chosen.variant.name == "cpu.conv2d.amxbf16"


@amx
def test_user_path_rejects_an_aliased_output():
    import tracea

    x = torch.randn(1, 16, 8, 8).bfloat16()
    w = torch.randn(16, 16, 3, 3).bfloat16()
    with pytest.raises(TraceaError):
        tracea.ops.conv2d(x, w, padding=1, out=x)


def test_tile_blocks_are_checked():
    op = Conv2dOp(1, 8, 8, 8, 8, 3, 3, dtype="bf16")
    assert not VARIANT.validate_config(op, config(mr=32, nr=64, wblk=512, threads=0), PROFILE)
    assert not VARIANT.validate_config(op, config(mr=24, nr=32, wblk=512, threads=0), PROFILE)
    assert not VARIANT.validate_config(op, config(mr=32, nr=32, wblk=0, threads=0), PROFILE)
    assert not VARIANT.validate_config(op, config(mr=96, nr=16, wblk=512, threads=0), PROFILE)
    assert not VARIANT.validate_config(op, config(mr=32, nr=32, wblk=512, kst=-1, threads=0), PROFILE)
    for mr, nr in CONV_TILES:
        assert VARIANT.validate_config(op, config(mr=mr, nr=nr, wblk=512, threads=0), PROFILE)


def test_declines_with_the_os_reason_when_refused(monkeypatch):
    refused = lambda: "the OS refused AMX tile data (test)"  # noqa: E731
    monkeypatch.setattr(amx_mod, "amx_permission", refused)  # what check() asks (amx.amx_bf16_reasons)
    monkeypatch.setattr(conv_mod, "amx_permission", refused)  # what library() asks
    op = Conv2dOp(1, 8, 8, 8, 8, 3, 3, dtype="bf16")
    assert any("refused AMX tile data" in r for r in VARIANT.check(op, AMX_PROFILE))
    with pytest.raises(BackendError, match="refused"):
        VARIANT.library(32, 32, "")


def test_declines_depthwise_like_groups():
    op = Conv2dOp(1, 32, 8, 8, 32, 3, 3, groups=32, dtype="bf16")
    assert any("groups of 1 input" in r for r in VARIANT.check(op, AMX_PROFILE))
    op = Conv2dOp(1, 32, 8, 8, 32, 3, 3, groups=8, dtype="bf16")
    assert not any("groups of" in r for r in VARIANT.check(op, AMX_PROFILE))
