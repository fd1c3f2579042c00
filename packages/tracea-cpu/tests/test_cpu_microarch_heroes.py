"""GEMM hero tables per CPU family: the table follows the profile's microarch (and only for the ISA it
was measured with), every family-specific hero computes correct results, and the CPU performance data
shipped for a family is only used on that family."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import GemmOp
from tracea.perfmodel import arch_key, load_file
from tracea_cpu import plugin
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES, MICROARCH_GEMM_HEROES, blocked_heroes, gemm_hero_table
from tracea_cpu.testing import HAVE_CC, ISAS, config, rel_err, run_gemm
from tracea_cpu.variants import CpuGemmVariant


def _profile(micro: str) -> DeviceProfile:
    best = micro.rsplit("-", 1)[-1]
    return DeviceProfile(Device.cpu(), "cpu", compute_units=2, extras={"microarch": micro, "best_isa": best})


def _params(cfgs):
    return [{k: c.get(k) for k in ("mr", "nr", "mc", "nc", "kc")} for c in cfgs]


def test_family_table_is_used_for_its_own_isa_only():
    avx512, avx2 = ISA_BY_NAME["avx512"], ISA_BY_NAME["avx2"]
    assert _params(gemm_hero_table(avx512, _profile("intel-avx512"))) == MICROARCH_GEMM_HEROES["intel-avx512"]
    assert _params(gemm_hero_table(avx512, _profile("amd-zen4-avx512"))) == GEMM_HEROES["avx512"]
    assert _params(gemm_hero_table(avx512, None)) == GEMM_HEROES["avx512"]
    assert _params(gemm_hero_table(avx2, _profile("intel-avx512"))) == GEMM_HEROES["avx2"]
    first = blocked_heroes(avx512, GemmOp(512, 512, 512), profile=_profile("intel-avx512"))[0]
    assert first.get("mc") == MICROARCH_GEMM_HEROES["intel-avx512"][0]["mc"]


def test_amd_avx2_table_and_the_waste_tolerance():
    """Zen 3's measured order (4x24 first) holds where its edge waste is within WASTE_TOLERANCE of the
    least (512 columns: 3.1% against 6x16's 0.8% of rows), not where 4x24 pads far more (5 rows)."""
    avx2 = ISA_BY_NAME["avx2"]
    prof = _profile("amd-avx2")
    assert _params(gemm_hero_table(avx2, prof)) == MICROARCH_GEMM_HEROES["amd-avx2"]
    for shape in ((512, 512, 512), (1024, 1024, 1024), (512, 4096, 4096)):
        first = blocked_heroes(avx2, GemmOp(*shape), profile=prof)[0]
        assert (first.get("mr"), first.get("nr")) == (4, 24), shape
    first = blocked_heroes(avx2, GemmOp(5, 512, 64), profile=prof)[0]
    assert (first.get("mr"), first.get("nr")) == (6, 16)  # 6 rows for 5 against 8
    assert _params(gemm_hero_table(avx2, _profile("intel-avx2"))) == GEMM_HEROES["avx2"]


def test_avx2_indirect_conv_heroes_take_deep_k_blocks():
    from tracea.ir.ops import Conv2dOp
    from tracea_cpu.spaces import INDIRECT_HEROES
    from tracea_cpu.variants import CpuConv2dVariant

    v = CpuConv2dVariant(ISA_BY_NAME["avx2"])
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        heroes = v.hero_configs(Conv2dOp(8, c, hw, hw, c, 3, 3, padding=1), _profile("amd-avx2"))
        # (the direct NCHW algorithm goes first where it does on AVX-512: few channels, many pixels)
        assert heroes[0].get("indirect") == (3 if c <= 64 else 1)
        first = next(h for h in heroes if h.get("indirect") == 1)
        assert first.get("kc") == INDIRECT_HEROES["avx2"][0]["kc"]
        assert (first.get("mr"), first.get("nr")) == (6, 16)
    # ISAs without a measured indirect table keep their GEMM heroes
    heroes = CpuConv2dVariant(ISA_BY_NAME["avx512"]).hero_configs(Conv2dOp(8, 64, 56, 56, 64, 3, 3, padding=1),
                                                                    _profile("amd-zen4-avx512"))
    first = next(h for h in heroes if h.get("indirect") == 1)
    assert first.get("kc") == GEMM_HEROES["avx512"][0]["kc"]


FAMILY_HEROES = [(fam, i) for fam in MICROARCH_GEMM_HEROES for i in range(len(MICROARCH_GEMM_HEROES[fam]))]


@pytest.mark.parametrize("family,hero", FAMILY_HEROES, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", [(53, 101, 77), (200, 131, 600), (7, 300, 33)])
def test_family_heroes_are_correct(family, hero, shape):
    isa = family.rsplit("-", 1)[-1]
    if not HAVE_CC or isa not in ISAS:
        pytest.skip(f"needs a C compiler and {isa}")
    cfg = config(**MICROARCH_GEMM_HEROES[family][hero], threads=0)
    op = GemmOp(*shape, epilogue="bias+silu")
    out, ref, _, _ = run_gemm(CpuGemmVariant(ISA_BY_NAME[isa]), op, cfg, hero)
    assert rel_err(out, ref) < 1e-5


def test_shipped_cpu_data_is_keyed_by_family():
    files = [load_file(p) for p in plugin.tracea_perf_data(_profile("intel-avx512"))]
    assert files and all(f.ok for f in files)
    assert {f.arch_key for f in files} >= {"cpu-intel-avx512"}
    assert arch_key(_profile("amd-zen4-avx512")) not in {f.arch_key for f in files}


def test_row_heroes_first_per_family():
    from tracea.ir.ops import Conv2dOp
    from tracea_cpu.variants import CpuConv2dVariant

    v = CpuConv2dVariant(ISA_BY_NAME["avx512"])
    op = Conv2dOp(1, 128, 28, 28, 128, 3, 3, padding=1)
    for family in ("intel-avx512", "amd-zen4-avx512"):  # 28^2: rows first on both (measured apart)
        first = v.hero_configs(op, _profile(family))[0]
        assert (first.get("mr"), first.get("nr")) == (7, 32) and first.get("indirect") == 1, family
    zen5 = v.hero_configs(op, _profile("amd-zen5-avx512"))[0]  # not measured: the default (14)
    assert (zen5.get("mr"), zen5.get("nr")) != (7, 32)
    small = Conv2dOp(1, 512, 7, 7, 512, 3, 3, padding=1)
    assert v.hero_configs(small, _profile("amd-zen4-avx512"))[0].get("mr") == 7  # 7^2: rows first everywhere


def test_family_hero_kc_follows_the_l1d():
    """The family table's kc is capped so the MR x kc A micro-panel fits 7/8 of the host's L1d."""
    from tracea_cpu.spaces import l1_kc

    avx512 = ISA_BY_NAME["avx512"]
    for l1, want in ((48 << 10, 768), (32 << 10, 512), (1 << 20, 768)):
        prof = DeviceProfile(Device.cpu(), "cpu", compute_units=2, caches={"L1d": l1},
                             extras={"microarch": "intel-avx512", "best_isa": "avx512"})
        first = gemm_hero_table(avx512, prof)[0]
        assert first.get("kc") == want  # 14 x 768 x 4 B = 42 KiB; 14 x 512 x 4 B = 28 KiB
    assert l1_kc(1024, 14, DeviceProfile(Device.cpu(), "cpu", compute_units=2)) == 1024  # unknown L1d
    assert l1_kc(1024, 6, DeviceProfile(Device.cpu(), "cpu", compute_units=2, caches={"L1d": 1024})) == 64
