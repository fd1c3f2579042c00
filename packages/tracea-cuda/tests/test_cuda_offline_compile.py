"""CI without a GPU: compile every hero configuration of every CUDA variant for sm_80 and sm_90a
with nvcc and fail on a compile error, register spills over the bound, or static shared memory over
48 KB. Skipped when nvcc is absent."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp

from tracea_cuda.emit import (depthwise, flash_attn, flash_decode, flash_wgmma, gemv, mma, pointwise, rows_fma, rows_kn, skinny,
                              wgmma)
from tracea_cuda.device import isa_flags
from tracea_cuda.offline import bundle, compile_report, nvcc_path
from tracea_cuda.variants import all_variants

SPILL_BOUND = 0          # bytes of spill stores/loads allowed per kernel
STATIC_SMEM_BOUND = 48 * 1024

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")

PROFILES = {
    "sm_80": DeviceProfile(Device("cuda", 0), "A100 (offline)", backend="cuda", arch="sm_80", compute_units=108,
                           compute_capability=(8, 0), warp_size=32, max_threads_per_block=1024,
                           shared_mem_per_block=166912, registers_per_block=65536, isa=isa_flags((8, 0))),
    "sm_90a": DeviceProfile(Device("cuda", 0), "H200 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                            compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                            shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)),
                            bandwidth_gbs=4800.0),  # the heroes of GPUs of >= 4 TB/s
}

OPS = {
    "cuda.gemm.wgmma": [GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu"),
                        GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16"),
                        GemmOp(4097, 4095, 1023, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias"),  # pitched
                        GemmOp(512, 384, 256, batch=2, trans_a=True, trans_b=True, dtype_a="float16",
                               dtype_b="float16", dtype_out="float32", epilogue="silu"),
                        GemmOp(512, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16",
                               epilogue="bias+gelu"),  # few tiles: split-K hero
                        GemmOp(128, 2048, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16",
                               epilogue="bias"),  # 128x64 split-K hero (>= 4 TB/s)
                        GemmOp(512, 5120, 5120, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16",
                               epilogue="bias+gelu"),  # 128x160 fill hero (hopper_tiles)
                        GemmOp(128, 5120, 5120, trans_b=True, dtype_a="float16", dtype_b="float16",
                               dtype_out="float32", epilogue="bias")],  # 128x48 fill hero, one row tile
    "cuda.gemm.wgmma_fewrows": [
        GemmOp(32, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"),  # split 4
        GemmOp(64, 11008, 4096, trans_b=True, dtype_a="float16", dtype_b="float16", epilogue="bias+gelu"),
        GemmOp(17, 1000, 336, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", dtype_out="float32",
               epilogue="bias+silu"),
        GemmOp(120, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias"),  # 128 cols
        GemmOp(112, 1024, 8192, trans_b=True, dtype_a="float16", dtype_b="float16", dtype_out="bfloat16",
               epilogue="relu")],
    "cuda.gemm.wgmma_fewrows_tf32": [
        GemmOp(32, 4096, 4096, trans_b=True, fp32_precision="high", epilogue="bias+gelu"),
        GemmOp(48, 1024, 8192, trans_b=True, fp32_precision="high", dtype_out="bfloat16"),  # split-K first
        GemmOp(127, 777, 1032, trans_b=True, fp32_precision="medium", epilogue="bias")],
    "cuda.gemm.mma_f16": [GemmOp(4096, 4096, 4096, dtype_a="float16", dtype_b="float16", epilogue="bias+gelu"),
                          GemmOp(512, 384, 256, batch=2, trans_a=True, trans_b=True, dtype_a="bfloat16",
                                 dtype_b="bfloat16", epilogue="bias+silu")],
    "cuda.gemm.wgmma_3xtf32": [GemmOp(4096, 4096, 4096, fp32_precision="highest", epilogue="bias")],
    "cuda.gemm.wgmma_tf32": [GemmOp(4096, 4096, 4096, fp32_precision="high", epilogue="bias+relu"),  # swapped
                             GemmOp(4096, 4096, 4096, trans_b=True, fp32_precision="high", epilogue="bias+relu"),
                             GemmOp(512, 384, 256, batch=2, trans_a=True, trans_b=True, fp32_precision="high",
                                    dtype_out="bfloat16", epilogue="bias+gelu"),
                             GemmOp(512, 384, 256, fp32_precision="high", dtype_out="float16", epilogue="silu"),
                             GemmOp(192, 2048, 4096, fp32_precision="high", epilogue="bias"),  # split-K, swapped
                             GemmOp(192, 2048, 4096, trans_b=True, fp32_precision="high", dtype_out="bfloat16")],
    "cuda.gemm.mma_tf32": [GemmOp(4096, 4096, 4096, fp32_precision="high", epilogue="relu")],
    "cuda.gemm.mma_3xtf32": [GemmOp(4096, 4096, 4096, trans_b=True, fp32_precision="highest", epilogue="bias")],
    "cuda.gemm.gemv": [GemmOp(1, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu"),
                       GemmOp(4, 4096, 1024, trans_b=True, dtype_a="float16", dtype_b="float16", epilogue="relu"),
                       GemmOp(4, 1000, 333, trans_b=True, epilogue="bias+silu")],
    "cuda.gemm.skinny_mma": [
        GemmOp(16, 11008, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu"),
        GemmOp(16, 4096, 11008, trans_b=True, dtype_a="float16", dtype_b="float16", dtype_out="float32"),
        GemmOp(3, 1000, 336, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="silu"),
        GemmOp(4, 1024, 8192, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias"),  # few blocks
        GemmOp(12, 1024, 8192, trans_b=True, dtype_a="float16", dtype_b="float16", epilogue="bias+relu"),
    ],
    "cuda.gemm.skinny_tf32": [  # 3xTF32 (fp32-exact) over 1-4 A fragments and every row class's heroes; TF32
        GemmOp(8, 4096, 25088, trans_b=True, epilogue="bias"),
        GemmOp(16, 11008, 4096, trans_b=True, epilogue="bias+gelu"),
        GemmOp(24, 1000, 336, trans_b=True, dtype_out="bfloat16", epilogue="silu"),
        GemmOp(64, 1024, 8192, trans_b=True, epilogue="bias+relu"),
        GemmOp(40, 768, 768, trans_b=True),
        GemmOp(12, 4096, 4096, trans_b=True, fp32_precision="high", epilogue="bias"),
    ],
    "cuda.gemm.rows_kn": [GemmOp(16, 4096, 4096, epilogue="bias+gelu"), GemmOp(3, 1001, 4096, dtype_a="bfloat16",
                                                                             dtype_b="bfloat16", epilogue="bias")],
    "cuda.gemm.rows_fma": [GemmOp(32, 4096, 4096, trans_b=True, epilogue="bias+gelu"),
                           GemmOp(64, 1000, 4097, trans_b=True, dtype_out="bfloat16", epilogue="silu")],
    "cuda.conv2d.pooled_gemm": [],  # runs the GEMM variants' kernels (compiled through their own cases)
    "cuda.conv2d.wgmma": [
        Conv2dOp(32, 64, 56, 56, 64, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias+relu"),
        Conv2dOp(32, 512, 7, 7, 512, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue="bias+relu"),
        Conv2dOp(32, 256, 14, 14, 256, 3, 3, padding=1, layout="nchw", dtype="float32", fp32_precision="high",
                 epilogue="bias+relu"),
        Conv2dOp(1, 512, 7, 7, 512, 3, 3, padding=1, layout="nchw", dtype="float32", fp32_precision="high",
                 epilogue="bias"),  # few tiles, long K: split-K hero
        Conv2dOp(1, 256, 14, 14, 256, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias+relu"),
        Conv2dOp(32, 3, 224, 224, 64, 7, 7, stride=2, padding=3, layout="nhwc", dtype="float16",
                 epilogue="bias+relu"),  # RGB stem padded to 8 channels: one (r, s) per 16-byte chunk
        Conv2dOp(8, 16, 56, 56, 64, 3, 3, padding=1, layout="nchw", dtype="float32", fp32_precision="high"),
        Conv2dOp(32, 40, 28, 28, 40, 3, 3, padding=1, layout="nhwc", dtype="float16",
                 epilogue="bias+relu"),  # C a multiple of the 16-byte chunk only: K-tiles straddle (r, s)
        Conv2dOp(1, 1000, 7, 7, 128, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias"),  # + split-K
        Conv2dOp(8, 160, 14, 14, 160, 3, 3, padding=1, layout="nchw", dtype="float16", epilogue="bias"),
    ],
    "cuda.conv2d.wgmma_nchw1x1": [
        Conv2dOp(32, 256, 56, 56, 64, 1, 1, layout="nchw", dtype="float16", epilogue="bias+relu"),
        Conv2dOp(32, 960, 7, 7, 160, 1, 1, layout="nchw", dtype="bfloat16", epilogue="bias"),  # pitched x
        Conv2dOp(1, 512, 14, 14, 2048, 1, 1, layout="nchw", dtype="float16", dtype_out="float32",
                 epilogue="bias+gelu"),
        Conv2dOp(1, 960, 7, 7, 160, 1, 1, layout="nchw", dtype="float16", epilogue="bias"),  # few tiles: split-K
        Conv2dOp(8, 64, 28, 28, 40, 1, 1, layout="nchw", dtype="bfloat16", epilogue="silu"),
        Conv2dOp(32, 256, 28, 28, 128, 1, 1, layout="nchw", dtype="float32", fp32_precision="high",
                 epilogue="bias+relu"),  # TF32: transposed, register-fed A, column-major C
        Conv2dOp(1, 1024, 7, 7, 256, 1, 1, layout="nchw", dtype="float32", fp32_precision="high",
                 dtype_out="bfloat16", epilogue="bias+gelu"),
    ],
    "cuda.conv2d.pointwise": [
        Conv2dOp(32, 32, 112, 112, 16, 1, 1, layout="nchw", dtype="float32", fp32_precision="high", epilogue="bias"),
        Conv2dOp(32, 96, 56, 56, 24, 1, 1, layout="nchw", dtype="float32", dtype_out="bfloat16", epilogue="bias+gelu"),
        Conv2dOp(1, 21, 9, 7, 13, 1, 1, layout="nchw", dtype="float32", epilogue="silu"),
        Conv2dOp(32, 32, 112, 112, 16, 1, 1, layout="nhwc", dtype="float16", epilogue="bias+relu"),
        Conv2dOp(4, 40, 28, 28, 24, 1, 1, layout="nhwc", dtype="bfloat16", dtype_out="float32", epilogue="bias"),
        Conv2dOp(2, 96, 13, 11, 24, 1, 1, layout="nhwc", dtype="float32", epilogue="bias+silu"),
    ],
    "cuda.conv2d.depthwise": [
        Conv2dOp(32, 96, 112, 112, 96, 3, 3, stride=2, padding=1, groups=96, layout="nhwc", dtype="float16",
                 epilogue="bias+silu"),  # EfficientNet / MobileNet depthwise
        Conv2dOp(32, 384, 14, 14, 384, 7, 7, padding=3, groups=384, layout="nhwc", dtype="bfloat16",
                 epilogue="bias"),  # ConvNeXt
        Conv2dOp(32, 128, 56, 56, 128, 3, 3, padding=1, groups=32, layout="nhwc", dtype="float16",
                 epilogue="bias+relu"),  # ResNeXt 32x4d
        Conv2dOp(8, 96, 56, 56, 96, 3, 3, padding=1, groups=96, layout="nchw", dtype="float32", epilogue="bias+relu"),
        Conv2dOp(3, 17, 15, 15, 34, 5, 5, padding=2, groups=17, layout="nhwc", dtype="float32", epilogue="gelu"),
    ],
    "cuda.attention.flash_mma": [
        AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"),
        AttentionOp(4, 16, 4096, 4096, 128, dtype="float16"),
        AttentionOp(4, 16, 4096, 4096, 64, causal=True, dtype="bfloat16"),
        AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16"),
        AttentionOp(2, 8, 77, 300, 64, kv_heads=2, dtype="bfloat16", mask="additive", mask_shape=(2, 1)),
        AttentionOp(2, 8, 300, 300, 128, dtype="float16", causal=True, mask="bool", mask_shape=(1, 1)),
    ],
    "cuda.attention.wgmma": [
        AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"),
        AttentionOp(4, 16, 4096, 4096, 128, dtype="float16"),
        AttentionOp(4, 16, 4096, 4096, 64, causal=True, dtype="bfloat16"),
        AttentionOp(4, 16, 4096, 4096, 64, dtype="float16"),
        AttentionOp(2, 32, 1000, 1777, 128, kv_heads=8, dtype="bfloat16"),
        AttentionOp(2, 32, 1000, 1777, 128, kv_heads=8, dtype="bfloat16", mask="bool", mask_shape=(2, 1)),
        AttentionOp(4, 16, 2048, 2048, 64, dtype="float16", causal=True, mask="additive", mask_shape=(1, 1)),
        AttentionOp(4, 16, 2048, 2048, 64, dtype="bfloat16", mask="additive", mask_shape=(4, 16)),
        AttentionOp(4, 16, 2048, 2048, 64, dtype="float16", mask="bool", mask_shape=(4, 1)),
        AttentionOp(4, 32, 2048, 2048, 128, kv_heads=8, dtype="float16", causal=True, mask="bool", mask_shape=(1, 1)),
        AttentionOp(4, 32, 2048, 2048, 128, kv_heads=8, dtype="bfloat16", mask="additive", mask_shape=(4, 1)),
    ],
    "cuda.attention.decode": [
        AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16"),
        AttentionOp(4, 32, 1, 4096, 64, kv_heads=8, dtype="float16"),
        AttentionOp(2, 32, 8, 4096, 128, kv_heads=8, dtype="bfloat16", causal=True),
        AttentionOp(2, 8, 1, 3000, 128, kv_heads=2, dtype="float16", mask="additive", mask_shape=(2, 1)),
        AttentionOp(2, 8, 5, 257, 64, dtype="bfloat16", causal=True, mask="bool", mask_shape=(1, 1)),
    ],
    "cuda.conv2d.implicit_mma": [
        Conv2dOp(32, 64, 56, 56, 64, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue="bias+relu"),
        Conv2dOp(32, 128, 28, 28, 128, 3, 3, padding=1, layout="nchw", dtype="float32", fp32_precision="high"),
        Conv2dOp(32, 256, 56, 56, 64, 1, 1, layout="nchw", dtype="float32", fp32_precision="high", epilogue="bias"),
    ],
}


def _gemv_render(spec, name: str) -> str:
    """The GEMV kernel under its own entry name (its renderer has a fixed one)."""
    return gemv.render(spec).replace(gemv.KERNEL_NAME, name)


def _sources(arch: str) -> dict[str, str]:
    profile = PROFILES[arch]
    sources: dict[str, str] = {}
    for variant in all_variants():
        for op in OPS.get(variant.name, []):
            if variant.requirements.check(op, profile):
                assert arch != "sm_90a", (variant.name, variant.requirements.check(op, profile))
                continue  # e.g. wgmma on sm_80
            render = (flash_wgmma.render if variant.name == "cuda.attention.wgmma"
                      else wgmma.render if ".wgmma" in variant.name else _gemv_render if variant.name == "cuda.gemm.gemv"
                      else skinny.render if variant.name.startswith("cuda.gemm.skinny")
                      else rows_kn.render if variant.name == "cuda.gemm.rows_kn"
                      else rows_fma.render if variant.name == "cuda.gemm.rows_fma"
                      else flash_attn.render if variant.name == "cuda.attention.flash_mma"
                      else flash_decode.render if variant.name == "cuda.attention.decode"
                      else pointwise.render if variant.name == "cuda.conv2d.pointwise"
                      else depthwise.render if variant.name == "cuda.conv2d.depthwise" else mma.render)
            for config in variant.hero_configs(op, profile):
                assert variant.validate_config(op, config, profile), (variant.name, config.key)
                name = f"k{len(sources)}"
                spec = (variant.spec(op, config, None, profile) if isinstance(op, AttentionOp)
                        else variant.spec(op, config, None))
                sources[name] = render(spec, name=name)
    return sources


def test_ptxas_advisories_are_parsed():
    from tracea_cuda.offline import parse_ptxas

    log = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
           "x in the function 'k1'\nptxas info    : Compiling entry function 'k1' for 'sm_90a'\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers\n")
    assert parse_ptxas(log)["k1"].advisories == ("C7514",)


def test_every_variant_has_offline_cases():
    assert set(OPS) == {v.name for v in all_variants()}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_hero_configs_compile_without_spills(arch):
    sources = _sources(arch)
    report = compile_report(bundle(sources), arch)
    assert set(report) == set(sources), "ptxas reported a different set of kernels"
    bad = {name: r for name, r in report.items()
           if r.spill_stores > SPILL_BOUND or r.spill_loads > SPILL_BOUND or r.static_smem > STATIC_SMEM_BOUND
           or r.advisories}  # e.g. C7514: ptxas serialised the wgmma pipeline
    assert not bad, f"kernels over the resource bounds on {arch}: {bad}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_helper_kernels_compile_with_their_pair_entry_points(dtype):
    """The transpose and channel pad (every dtype) and the 3xTF32 split: the single and the two-job entry
    points compile without spills (the pair form is what the bound Hopper NCHW conv / 3xTF32 GEMM launch)."""
    from tracea.dtypes import DType

    from tracea_cuda.emit import pad, split, transpose

    src = (transpose.render(DType.parse(dtype)) + pad.render(DType.parse(dtype))
           + (split.render() if dtype == "float32" else ""))
    report = compile_report(src, "sm_90a")
    want = {transpose.KERNEL_NAME, transpose.PAIR_NAME, pad.PAIR_NAME} | (
        {split.KERNEL_NAME, split.PAIR_NAME} if dtype == "float32" else set())
    assert set(report) == want
    assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in report.values()), report


def test_deferred_epilogue_is_declined_where_it_cannot_run():
    """The deferred epilogue stashes 16-bit values: fp32 outputs, pingpong and the direct epilogue decline it
    with a reason the Doctor can show; 16-bit heroes of big GEMMs include it."""
    from tracea_cuda.variants.hopper import WgmmaGemm, _hero

    v, profile = WgmmaGemm(), PROFILES["sm_90a"]
    f32 = GemmOp(256, 256, 256, dtype_a="float16", dtype_b="float16", dtype_out="float32", epilogue="bias+gelu")
    bf16 = GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu")
    assert "16-bit" in v.validate_config(f32, _hero(256, 3, cluster=1, defer=True), profile).reason
    assert not v.validate_config(bf16, _hero(128, 6, schedule="pingpong", cluster=1, defer=True), profile)
    assert not v.validate_config(bf16, _hero(256, 3, smem_epilogue=False, cluster=1, defer=True), profile)
    assert not v.validate_config(bf16, _hero(256, 4, cluster=1, defer=True), profile)  # no room for the stash
    assert any(c.get("defer") for c in v.hero_configs(bf16, profile))
    assert not any(c.get("defer") for c in v.hero_configs(f32, profile))
