"""Without a GPU: the flash-attention variant's Doctor checks, configs and heroes, and its kernels compile
for sm_80 and sm_90a with nvcc without register spills (the nvcc part skips when nvcc is absent)."""

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
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_hero_kernels_compile_without_spills(arch):
    for op in OPS:
        config = V.hero_configs(op, H100)[0]
        spec = V.spec(op, config, None, H100)
        report = compile_report(flash_attn.render(spec), arch)
        res = report[flash_attn.KERNEL_NAME]
        # the one known exception: causal d128 with two m-tiles per warp spills 20 B on sm_90a, and
        # measured 1.2x faster than the spill-free one-m-tile config on an H100 (bench_attention.py)
        allowed = 32 if (spec.causal and spec.head_dim == 128 and spec.mt == 2 and arch == "sm_90a") else 0
        assert res.spill_stores <= allowed and res.spill_loads <= 2 * allowed, (op.describe(), spec, res)
        if spec.splits > 1:
            assert flash_attn.COMBINE_NAME in compile_report(flash_attn.render_combine(spec), arch)
