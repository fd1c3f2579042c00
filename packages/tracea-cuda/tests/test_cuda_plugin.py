"""CPU-only tests: the plugin imports and degrades without CuPy; the emitter renders every mode."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.errors import UnsupportedConfigError
from tracea.ir.device import Device
from tracea.ir.ops import Conv2dOp, GemmOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda import plugin, toolkit
from tracea_cuda.emit.mma import render
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

H200 = DeviceProfile(Device("cuda", 0), "H200 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536)


def test_backend_info_never_raises():
    info = plugin.tracea_backend_info()
    assert info.name == "cuda"
    ok, reason = toolkit.status()
    assert info.available == ok and (ok or reason)


def test_variants_explain_unavailability():
    ok, reason = toolkit.status()
    if ok:
        pytest.skip("toolkit present")
    op = GemmOp(64, 64, 64, dtype_a="float16", dtype_b="float16")
    for v in all_variants():
        assert v.check(op, H200) == [reason] or v.op_kind.value != "gemm"


def test_precision_selects_math():
    from tracea.dtypes import DType, Fp32Precision

    assert math_mode(DType.F32, Fp32Precision.HIGH) == "tf32"
    assert math_mode(DType.F32, Fp32Precision.HIGHEST) == "3xtf32"
    assert math_mode(DType.BF16, Fp32Precision.HIGHEST) == "bf16"


def test_render_reflects_config():
    v = [x for x in all_variants() if x.name == "cuda.gemm.mma_f16"][0]
    op = GemmOp(256, 256, 256, dtype_a="float16", dtype_b="float16", epilogue="bias+gelu_erf")
    src = render(v.spec(op, PipelineConfig(128, 128, 32, 5, 4, "xor4", "sync"), None))
    assert "stages=5" in src and "erff" in src and "cp.async.cg" in src and "ldmatrix" in src
    assert "& 3)" in src  # xor4 swizzle mask
    none = render(v.spec(op, PipelineConfig(128, 128, 32, 3, 4, "none", "sync"), None))
    assert "& 0)" in none


def test_invalid_tiling_is_rejected_with_reason():
    v = [x for x in all_variants() if x.name == "cuda.gemm.mma_f16"][0]
    op = GemmOp(256, 256, 256, dtype_a="float16", dtype_b="float16")
    bad = PipelineConfig(40, 128, 32, 3, 4)
    assert not v.validate_config(op, bad, H200)
    huge = PipelineConfig(128, 128, 64, 8, 8)
    assert "shared memory" in v.validate_config(op, huge, H200).reason
    with pytest.raises(UnsupportedConfigError):
        v.spec(op, bad, None).check()


def test_search_space_is_nonempty_and_valid():
    v = [x for x in all_variants() if x.name == "cuda.conv2d.implicit_mma"][0]
    op = Conv2dOp(32, 64, 56, 56, 64, 3, 3, padding=1, layout="nhwc", dtype="float16")
    configs = list(v.search_space(op, H200))
    assert configs and all(v.validate_config(op, c, H200) for c in configs[:50])


def test_cupy_memory_span_handles_negative_strides():
    # tracea.ops refuses an out= whose span meets an input's (found by the ops fuzzer); no GPU needed.
    from types import SimpleNamespace

    from tracea_cuda.arrays import CupyAdapter

    arr = SimpleNamespace(size=12, shape=(3, 4), strides=(-16, 4), itemsize=4, data=SimpleNamespace(ptr=1000))
    assert CupyAdapter().memory_span(arr) == (1000 - 32, 1000 + 12 + 4)
    assert CupyAdapter().memory_span(SimpleNamespace(size=0)) is None
