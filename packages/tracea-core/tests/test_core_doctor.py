"""The Doctor: host profile, ranking by cache evidence then estimate, forced/excluded variants, reasons."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tracea import GemmOp, LayerType, PipelineConfig
from tracea.doctor import Doctor, KernelVariant, Requirements
from tracea.doctor.cpu_probe import probe_cpu
from tracea.errors import NoVariantError, UnsupportedDeviceError
from tracea.plugins import create_plugin_manager, hookimpl
from tracea.semantic.search_space import SearchSpace

OP = GemmOp(64, 64, 64)


def test_host_profile_lists_isa_and_caches(core_doctor):
    cpu = core_doctor.profile_for("cpu")
    info = probe_cpu()
    assert cpu.compute_units == info.cores >= 1
    assert set(info.simd) <= set(cpu.isa) and f"isa:{info.best_isa}" in cpu.isa
    assert cpu.peak() > 0
    if info.arch == "x86_64":
        assert "sse2" in cpu.isa
    assert cpu.fingerprint() == core_doctor.profile_for("cpu:0").fingerprint()


def test_isa_summary_names_amx_with_its_types_and_os_state():
    """A CPU with AMX is not reported as "best ISA: avx512" alone: the summary adds AMX, the tile data
    types the CPU has and whether the OS lets the process use tile data."""
    import dataclasses

    from tracea.doctor.cpu_probe import amx_os_state

    info = probe_cpu()
    base = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma")
    amx = dataclasses.replace(info, simd=base + ("amx_tile", "amx_bf16", "amx_int8"))
    assert amx.matrix_isa == "amx"
    assert amx.isa_summary == f"avx512 + amx (bf16 int8; OS: {amx_os_state()})"
    plain = dataclasses.replace(info, simd=base)
    assert plain.matrix_isa == "" and plain.isa_summary == "avx512"
    assert amx_os_state().startswith(("tile data allowed", "kernel lacks", "unknown"))


class _Fast(KernelVariant):
    name, backend, efficiency, description = "t.fast", "t", 0.9, "fast"
    requirements = Requirements("cpu", LayerType.GEMM, max_dims={"k": 1000})

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=32, warps=1)]


class _Slow(KernelVariant):
    name, backend, efficiency, description = "t.slow", "t", 0.1, "slow"
    requirements = Requirements("cpu", LayerType.GEMM)

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=16, warps=1)]

    def search_space(self, op, profile):
        return SearchSpace().tile_m([16, 64]).warps([1])


class _Picky(KernelVariant):
    name, backend, efficiency, description = "t.picky", "t", 1.0, "needs a made-up ISA"
    requirements = Requirements("cpu", LayerType.GEMM, isa=("made_up_isa",), dtypes=frozenset())


@dataclass
class _Entry:
    config: PipelineConfig
    median_s: float
    variant: str


class _Cache:
    generation = 0

    def __init__(self, entries):
        self.entries = entries

    def lookup(self, op, variant_name, profile):
        return self.entries.get(variant_name)


@pytest.fixture
def doctor(monkeypatch):
    mod = type("M", (), {})()

    @hookimpl
    def tracea_register_variants():
        return [_Fast(), _Slow(), _Picky()]

    mod.tracea_register_variants = tracea_register_variants
    monkeypatch.setenv("TRACEA_PLUGINS", "")  # only built-ins + the test variants (real backends would compete)
    pm = create_plugin_manager(autoload=False)
    pm.register(mod, name="t")
    return Doctor(pm)


def _no_cache(monkeypatch, cache=None):
    import tracea.doctor.doctor as dd

    monkeypatch.setattr(dd, "_tuning_cache", lambda: cache)


def test_rank_by_estimate_and_record_rejections(doctor, monkeypatch):
    _no_cache(monkeypatch)
    d = doctor.decide(OP, "cpu")
    assert [c.variant.name for c in d.candidates][:2] == ["t.fast", "t.slow"]
    assert d.candidates[-1].variant.name == "reference.gemm"
    assert d.chosen.source == "hero" and d.config.tile_m == 32
    picky = next(r for r in d.rejected if r.variant == "t.picky")
    assert any("made_up_isa" in r for r in picky.reasons) and any("float32" in r for r in picky.reasons)
    assert "t.picky" in d.explain() and "chosen: t.fast" in d.explain()


def test_cache_evidence_beats_estimates(doctor, monkeypatch):
    _no_cache(monkeypatch, _Cache({"t.slow": _Entry(PipelineConfig(tile_m=64, warps=1), 1e-4, "t.slow")}))
    d = doctor.decide(OP, "cpu")
    assert d.variant.name == "t.slow" and d.chosen.source == "cache" and d.config.tile_m == 64
    assert d.chosen.measured_s == 1e-4


def test_cache_entry_outside_heroes_and_space_is_ignored(doctor, monkeypatch):
    cfg = PipelineConfig(tile_m=64, warps=2)  # warps is not a dimension of t.slow's space
    _no_cache(monkeypatch, _Cache({"t.slow": _Entry(cfg, 1e-9, "t.slow")}))
    with pytest.warns(UserWarning, match="neither a hero config nor a point"):
        d = doctor.decide(OP, "cpu")
    slow = next(c for c in d.candidates if c.variant.name == "t.slow")
    assert slow.source == "hero" and slow.measured_s is None and "ignored" in slow.note
    assert d.variant.name == "t.fast"


def test_size_limits_reject(doctor, monkeypatch):
    _no_cache(monkeypatch)
    d = doctor.decide(GemmOp(8, 8, 4096), "cpu")
    assert d.variant.name == "t.slow"
    assert any("k=4096 exceeds 1000" in r for r in next(x for x in d.rejected if x.variant == "t.fast").reasons)


def test_forced_and_excluded_variants(doctor, monkeypatch):
    _no_cache(monkeypatch)
    assert doctor.decide(OP, "cpu", variant="t.slow").variant.name == "t.slow"
    monkeypatch.setenv("TRACEA_VARIANT", "t.slow")
    assert doctor.decide(GemmOp(8, 8, 8), "cpu").variant.name == "t.slow"
    monkeypatch.delenv("TRACEA_VARIANT")
    monkeypatch.setenv("TRACEA_EXCLUDE_VARIANTS", "t.fast")
    d = doctor.decide(GemmOp(9, 9, 9), "cpu")
    assert d.variant.name == "t.slow"
    with pytest.raises(NoVariantError, match="t.picky"):
        doctor.decide(OP, "cpu", variant="t.picky")
    forced = doctor.decide(GemmOp(10, 10, 10), "cpu", variant="t.slow", config=PipelineConfig(tile_m=8, warps=1))
    assert forced.chosen.source == "forced"


def test_framework_faster_declines_stay_candidates_only_for_a_framework_check(doctor, monkeypatch):
    """A variant whose only reasons are FrameworkFaster (a speed judgement against the framework, not a
    limit) is rejected, unless the caller will time it against the framework (framework_check=True) or forces
    it (a pin overrides a speed judgement); a limit among its reasons keeps it rejected."""
    from tracea.doctor import FrameworkFaster

    _no_cache(monkeypatch)
    fast = doctor.registry.get("t.fast")
    soft = FrameworkFaster("the framework's kernel measured faster here")
    monkeypatch.setattr(fast, "check", lambda op, profile: [soft])
    d = doctor.decide(OP, "cpu")
    assert d.variant.name == "t.slow" and d.chosen.framework_faster == ""
    assert next(r for r in d.rejected if r.variant == "t.fast").reasons == [soft]
    kept = doctor.decide(OP, "cpu", framework_check=True)
    assert kept is not d and kept.variant.name == "t.fast"  # memoised apart
    assert kept.chosen.framework_faster == str(soft) and "t.fast" not in {r.variant for r in kept.rejected}
    assert "kept (forced, or for the framework check) despite" in kept.explain()
    assert kept.chosen.to_dict()["framework_faster"] == str(soft)
    assert doctor.decide(OP, "cpu", variant="t.slow", framework_check=True).variant.name == "t.slow"
    for check in (True, False):  # forced: the pin overrides the speed judgement
        pinned = doctor.decide(OP, "cpu", variant="t.fast", framework_check=check)
        assert pinned.variant.name == "t.fast" and pinned.chosen.framework_faster == str(soft)
    monkeypatch.setattr(fast, "check", lambda op, profile: [soft, "k too large"])
    doctor.invalidate()
    mixed = doctor.decide(OP, "cpu", framework_check=True)
    assert mixed.variant.name == "t.slow" and "t.fast" in {r.variant for r in mixed.rejected}
    with pytest.raises(NoVariantError, match="k too large"):
        doctor.decide(OP, "cpu", variant="t.fast")  # a limit stands for a pin too


def test_unknown_device(doctor):
    with pytest.raises(UnsupportedDeviceError, match="cuda:0.*tracea-cuda"):
        doctor.decide(OP, "cuda:0")


def test_decisions_are_memoised(doctor, monkeypatch):
    _no_cache(monkeypatch)
    assert doctor.decide(OP, "cpu") is doctor.decide(GemmOp(64, 64, 64), "cpu")
    doctor.invalidate()
    assert doctor.decide(OP, "cpu") is not None


def test_best_device_is_cpu_without_gpus(core_doctor):
    assert str(core_doctor.best_device()) == "cpu:0"
    assert isinstance(np.ones(1), np.ndarray)


def test_reference_oracle_ranks_last_whatever_the_estimates(doctor, monkeypatch):
    _no_cache(monkeypatch)
    monkeypatch.setattr(_Fast, "estimate_seconds", lambda self, op, profile, config=None: 10.0)
    monkeypatch.setattr(_Slow, "estimate_seconds", lambda self, op, profile, config=None: 20.0)
    d = doctor.decide(GemmOp(3, 3, 3), "cpu")
    assert [c.variant.name for c in d.candidates] == ["t.fast", "t.slow", "reference.gemm_blas", "reference.gemm"]
