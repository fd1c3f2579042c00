"""Without a GPU: the flash-attention variant's Doctor checks, configs and heroes, and its split-KV
combine kernel compiles for sm_80 and sm_90a (the hero kernels are compiled with every other variant's
in ``test_cuda_offline_compile.py``; the nvcc parts skip when nvcc is absent)."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import AttentionOp

from tracea_cuda.device import isa_flags
from tracea_cuda.emit import flash_attn
from tracea_cuda.offline import compile_report, nvcc_path
from tracea_cuda.variants.attention import FlashAttention, auto_splits

H100 = DeviceProfile(Device("cuda", 0), "H100 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)))
V = FlashAttention()
OPS = [AttentionOp(4, 16, 4096, 4096, 128, causal=True, dtype="bfloat16"),
       AttentionOp(4, 16, 4096, 4096, 64, dtype="float16"),
       AttentionOp(1, 32, 1, 32768, 128, kv_heads=8, dtype="bfloat16"),
       AttentionOp(2, 8, 77, 300, 64, kv_heads=2, dtype="bfloat16", mask="additive", mask_shape=(2, 1))]


def test_requirements_and_reasons():
    assert V.check(OPS[0], H100) == [] or all("toolkit" in r or "CuPy" in r or "cupy" in r for r in V.check(OPS[0], H100))
    reasons = V.requirements.check(AttentionOp(1, 2, 8, 8, 64, dtype="float32"), H100)
    assert any("float32" in r for r in reasons)
    assert V.extra_checks(AttentionOp(1, 2, 8, 8, 96, dtype="bfloat16"), H100)
    assert any("dropout" in r for r in V.requirements.check(AttentionOp(1, 2, 8, 8, 64, dtype="bfloat16",
                                                                        dropout_p=0.1), H100))


def test_heroes_are_valid_and_decode_splits_the_keys():
    for op in OPS:
        heroes = V.hero_configs(op, H100)
        assert heroes and all(V.validate_config(op, c, H100) for c in heroes), op.describe()
    decode = OPS[2]
    assert V.spec(decode, V.hero_configs(decode, H100)[0], None, H100).splits > 8
    assert auto_splits(OPS[0], 128, 64, 132) == 1  # prefill fills the GPU without splitting


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_split_combine_kernel_compiles():
    """The main kernels of every hero compile without spills in ``test_cuda_offline_compile.py``; the
    split-KV combine kernel is compiled here."""
    decode = OPS[2]
    spec = V.spec(decode, V.hero_configs(decode, H100)[0], None, H100)
    assert spec.splits > 1
    for arch in ("sm_80", "sm_90a"):
        res = compile_report(flash_attn.render_combine(spec), arch)[flash_attn.COMBINE_NAME]
        assert res.spill_stores == 0 and res.spill_loads == 0


# -- cuda.attention.wgmma (Hopper) -------------------------------------------------------------------

def test_wgmma_variant_requirements_and_ranking():
    """sm_90a only; masks declined (flash_mma serves them); prefill ranks above flash_mma, one-token
    decode and short-query long-KV shapes below it (its split-KV fills the GPU)."""
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma

    w = FlashAttentionWgmma()
    a100 = DeviceProfile(Device("cuda", 0), "A100 (offline)", backend="cuda", arch="sm_80", compute_units=108,
                         compute_capability=(8, 0), warp_size=32, max_threads_per_block=1024,
                         shared_mem_per_block=166912, registers_per_block=65536, isa=isa_flags((8, 0)))
    assert w.requirements.check(OPS[0], a100)
    assert w.requirements.check(OPS[0], H100) == []
    assert any("mask" in r for r in w.requirements.check(OPS[3], H100))
    assert w.extra_checks(AttentionOp(1, 2, 8, 8, 96, dtype="bfloat16"), H100)
    for op in (OPS[0], OPS[1], AttentionOp(4, 32, 4096, 4096, 128, kv_heads=8, dtype="bfloat16")):
        assert w.extra_checks(op, H100) == []
        assert w.estimate_seconds(op, H100) < V.estimate_seconds(op, H100), op.describe()
    for op in (OPS[2], AttentionOp(1, 8, 128, 32768, 128, dtype="bfloat16")):
        assert w.estimate_seconds(op, H100) > V.estimate_seconds(op, H100), op.describe()


def test_wgmma_configs_are_valid_or_declined_with_reasons():
    from tracea_cuda.variants.attention_wgmma import FlashAttentionWgmma
    from tracea_cuda.variants.base import hero

    w = FlashAttentionWgmma()
    for op in (OPS[0], OPS[1], AttentionOp(2, 32, 1000, 1777, 128, kv_heads=8, dtype="float16")):
        heroes = w.hero_configs(op, H100)
        assert heroes and all(w.validate_config(op, c, H100) for c in heroes), op.describe()
        space = w.search_space(op, H100)
        assert space is not None
    d128 = OPS[0]
    assert "registers" in w.validate_config(d128, hero(192, 128, 128, 2, 16), H100).reason  # O+S+P over 160
    assert "shared memory" in w.validate_config(d128, hero(128, 256, 128, 3, 12), H100).reason
    assert "warps" in w.validate_config(d128, hero(128, 128, 128, 2, 8), H100).reason
    assert "multiple of 16" in w.validate_config(d128, hero(128, 120, 128, 2, 12), H100).reason


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
def test_wgmma_kernels_compile_without_spills():
    """Kernels beside the heroes (compiled in test_cuda_offline_compile.py): three consumer warpgroups at
    D128, no ping-pong, float16, deep rings -- no spills, no stack, no ptxas advisory (C7514: wgmma
    serialised)."""
    from tracea.dtypes import DType
    from tracea_cuda.emit import flash_wgmma
    from tracea_cuda.offline import bundle

    specs = [flash_wgmma.FlashWgmmaSpec(DType.BF16, 128, 80, 3, 2, True, pingpong=False),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 64, 192, 2, 4, False),
             flash_wgmma.FlashWgmmaSpec(DType.F16, 128, 192, 2, 2, True)]
    sources = {f"k{i}": flash_wgmma.render(s, name=f"k{i}") for i, s in enumerate(specs)}
    report = compile_report(bundle(sources), "sm_90a")
    assert set(report) == set(sources)
    for name, res in report.items():
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack == 0 and not res.advisories, (name, res)
