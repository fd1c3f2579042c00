"""Without a GPU: the CUDA epilogues keep NaN (docs/architecture.md, "Numerics"). No rendered kernel
clamps with ``fmaxf`` / ``fminf`` (they return the other operand when one is NaN: ReLU turned NaN into
0, the fp16 deferred-epilogue clamp turned it into -65504); ReLU and the clamp compile to PTX's
NaN-propagating ``max.NaN.f32`` on sm_80 and sm_90a; the 3xTF32 split keeps NaN / +-Inf whole. The
nvcc parts skip when nvcc is absent."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import Conv2dOp, GemmOp

from tracea_cuda.device import isa_flags
from tracea_cuda.emit import gemv, mma, split, splitk, wgmma
from tracea_cuda.offline import GENCODE, bundle, compile_report, nvcc_path
from tracea_cuda.testing import tf32_rna
from tracea_cuda.variants import all_variants

VARIANTS = {v.name: v for v in all_variants()}
H200 = DeviceProfile(Device("cuda", 0), "H200 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)))
A100 = DeviceProfile(Device("cuda", 0), "A100 (offline)", backend="cuda", arch="sm_80", compute_units=108,
                     compute_capability=(8, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=166912, registers_per_block=65536, isa=isa_flags((8, 0)))
ACTIVATIONS = ["bias+relu", "gelu", "bias+gelu_erf", "silu"]


def _sources() -> dict[str, tuple[str, str]]:
    """name -> (arch, CUDA source) for kernels whose epilogues carry each activation: mma.sync GEMM and
    conv, the split-K reducer, the few-row GEMV, the Hopper GEMM with its deferred fp16 / bf16
    epilogues, the Hopper conv, and the 3xTF32 split pass."""
    from tracea_cuda.variants.hopper import _hero

    out: dict[str, tuple[str, str]] = {}
    for epi in ACTIVATIONS:
        gemm = VARIANTS["cuda.gemm.mma_f16"]
        op = GemmOp(512, 384, 256, dtype_a="float16", dtype_b="float16", epilogue=epi)
        out[f"mma_{epi}"] = ("sm_80", mma.render(gemm.spec(op, gemm.hero_configs(op, A100)[0], None), name=f"m{len(out)}"))
        conv = VARIANTS["cuda.conv2d.implicit_mma"]
        cop = Conv2dOp(2, 64, 14, 14, 64, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue=epi)
        out[f"conv_{epi}"] = ("sm_80", mma.render(conv.spec(cop, conv.hero_configs(cop, A100)[0], None), name=f"m{len(out)}"))
        out[f"splitk_{epi}"] = ("sm_80", splitk.render(op.out_dtype, op.out_dtype, op.epilogue, 4))
        gv = VARIANTS["cuda.gemm.gemv"]
        for dt in ("float16", "float32"):
            gop = GemmOp(4, 4096, 4096, trans_b=True, dtype_a=dt, dtype_b=dt, epilogue=epi)
            src = gemv.render(gv.spec(gop, gv.hero_configs(gop, A100)[0], None))
            out[f"gemv_{dt}_{epi}"] = ("sm_80", src)
        hop = VARIANTS["cuda.gemm.wgmma"]
        for dt in ("float16", "bfloat16"):
            wop = GemmOp(4096, 4096, 4096, dtype_a=dt, dtype_b=dt, epilogue=epi)
            for config in (_hero(256, 3, 16, cluster=1, defer=True), _hero(256, 4, cluster=1)):
                assert hop.validate_config(wop, config, H200), config.key
                out[f"wgmma_{dt}_{epi}_{config.key}"] = ("sm_90a", wgmma.render(hop.spec(wop, config, None), name=f"w{len(out)}"))
        hconv = VARIANTS["cuda.conv2d.wgmma"]
        hcop = Conv2dOp(2, 64, 14, 14, 64, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue=epi)
        out[f"wgmma_conv_{epi}"] = ("sm_90a", wgmma.render(hconv.spec(hcop, hconv.hero_configs(hcop, H200)[0], None),
                                                           name=f"w{len(out)}"))
    out["split3"] = ("sm_90a", split.render())
    return out


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*", "", src)


def test_no_epilogue_clamps_with_nan_dropping_min_max():
    for name, (_, src) in _sources().items():
        code = _strip_comments(src)
        assert "fmaxf(" not in code and "fminf(" not in code, name
        if "relu" in name:
            assert "relu_f(" in code, name


def test_fp16_deferred_clamp_keeps_nan():
    src = _strip_comments(_sources()["wgmma_float16_silu_" + _defer_key()][1])
    assert "max_nan_f(v0, -65504.0f)" in src and "max_nan_f(v1, -65504.0f)" in src


def _defer_key() -> str:
    from tracea_cuda.variants.hopper import _hero

    return _hero(256, 3, 16, cluster=1, defer=True).key


def test_split3_sends_nonfinite_values_whole_to_the_third_segment():
    src = split.render()
    assert "o[2 * K] = finite ? big : x;" in src and "0x7f800000u" in src


def test_mma_3xtf32_split_keeps_ieee_products_of_special_values():
    """The register split of the mma.sync 3xTF32 path (emit/mma.py: tf32_rest, tf32_finite), emulated in
    float32 on every pair of special and ordinary values: the three products sum to a*b's class (NaN, the
    signed Inf, or a finite value within 2^-20 relative). Before, Inf - Inf made the small part NaN."""
    import numpy as np

    src = mma.render(VARIANTS["cuda.gemm.mma_3xtf32"].spec(
        GemmOp(64, 64, 64, fp32_precision="highest"),
        VARIANTS["cuda.gemm.mma_3xtf32"].hero_configs(GemmOp(64, 64, 64, fp32_precision="highest"), A100)[0], None))
    assert "tf32_rest(" in src and "tf32_finite(" in src
    vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1.0000001, 0.99999994, -3.3333333,
                     1e-30, 7.1e37, -2.5e-3], np.float32)
    a, b = (v.ravel() for v in np.meshgrid(vals, vals))
    with np.errstate(invalid="ignore", over="ignore"):
        def parts(x):
            big = tf32_rna(x)
            rest = x - big
            small = tf32_rna(np.where(np.isnan(rest), np.float32(0), rest))
            return big, small, np.where(np.isfinite(big), big, np.float32(0))
        ab, as_, af = parts(a)
        bb, bs, bf = parts(b)
        got = (as_ * bf + af * bs) + ab * bb
        ref = a * b  # IEEE float32 product (float64's would not underflow / overflow like fp32)
    assert (np.isnan(got) == np.isnan(ref)).all()
    inf = np.isinf(ref)
    assert (got[inf] == ref[inf]).all()
    fin = np.isfinite(ref)
    assert np.allclose(got[fin], ref[fin], rtol=2.0 ** -20, atol=1e-37)


needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nan_propagating_epilogues_compile(arch):
    sources = {name: src for name, (a, src) in _sources().items() if a == arch}
    if arch == "sm_90a":  # the mma.sync kernels run there too
        sources.update({name: src for name, (a, src) in _sources().items() if a == "sm_80"})
    report = compile_report(bundle(_renamed(sources)), arch)
    pairs = sum(split.PAIR_NAME in src for src in sources.values())  # the split source has two entry points
    assert len(report) == len(sources) + pairs, sorted(report)
    assert not {k: r for k, r in report.items() if r.spill_stores or r.spill_loads}


def _renamed(sources: dict[str, str]) -> dict[str, str]:
    """Kernel sources with unique entry names (the reducer and the split pass have fixed names)."""
    out = {}
    for i, src in enumerate(sources.values()):
        for fixed in (splitk.KERNEL_NAME, split.KERNEL_NAME, gemv.KERNEL_NAME):
            src = src.replace(fixed, f"{fixed}_{i}")
        out[f"k{i}"] = src
    return out


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_relu_is_one_nan_propagating_max_in_ptx(arch):
    src = splitk.render(GemmOp(8, 8, 8).out_dtype, GemmOp(8, 8, 8).out_dtype, GemmOp(8, 8, 8, epilogue="relu").epilogue, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cu")
        with open(path, "w") as f:
            f.write(src)
        proc = subprocess.run([nvcc_path(), "-ptx", GENCODE[arch], "-std=c++17", "-o", os.path.join(tmp, "k.ptx"),
                               path], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        ptx = open(os.path.join(tmp, "k.ptx")).read()
    assert "max.NaN.f32" in ptx
    assert not re.search(r"\bmax\.f32", ptx)  # no NaN-dropping max left
