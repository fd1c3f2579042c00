"""The performance model (tracea.perfmodel): data validation, fitting, the three estimate tiers, the
Doctor's use of it (rankings, explanations, fallbacks) and the user's tuning records refreshing it."""

from __future__ import annotations

import json
import math

import pytest

from tracea import perfmodel
from tracea.doctor import Doctor
from tracea.doctor.cpu_probe import CpuInfo
from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import KernelVariant, Requirements
from tracea.dtypes import DType
from tracea.ir.device import Device
from tracea.ir.ops import Conv2dOp, GemmOp, LayerType
from tracea.perfmodel import PerfModel, arch_key, load_file
from tracea.perfmodel.data import pack, parse, user_observations
from tracea.perfmodel.features import group_key, shape_vector, wave_factor
from tracea.plugins import create_plugin_manager, hookimpl
from tracea.semantic.config import PipelineConfig
from tracea.tuning.cache import CacheEntry, TuningCache
from tracea.tuning.fingerprint import device_fingerprint

pytestmark = pytest.mark.usefixtures("no_env_plugin_list")


def _cpu(vendor="GenuineIntel", family=6, flags=("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl")):
    return CpuInfo("x", vendor, "x86_64", 2, 2, tuple(flags), family=family)


def test_microarch_tells_cpu_families_apart():
    assert _cpu().microarch == "intel-avx512"
    assert _cpu("AuthenticAMD", 25).microarch == "amd-zen4-avx512"
    assert _cpu("AuthenticAMD", 26).microarch == "amd-zen5-avx512"
    assert _cpu("AuthenticAMD", 25, ("avx2", "fma")).microarch == "amd-avx2"
    assert _cpu(flags=("avx2", "fma")).microarch == "intel-avx2"
    assert CpuInfo("m", "", "aarch64", 4, 4, ("neon",)).microarch == "arm-neon"


def _profile(micro="intel-avx512", kind="cpu"):
    return DeviceProfile(Device(kind, 0), "test cpu", vendor="GenuineIntel", compute_units=2,
                         peak_gflops={"float32": 100.0}, bandwidth_gbs=10.0, extras={"microarch": micro})


def test_arch_keys():
    assert arch_key(_profile()) == "cpu-intel-avx512"
    assert arch_key(_profile("amd-zen4-avx512")) == "cpu-amd-zen4-avx512"
    gpu = DeviceProfile(Device("cuda", 0), "g", arch="sm_90a", compute_capability=(9, 0))
    assert arch_key(gpu) == "sm_90"


def test_features():
    a, b = GemmOp(512, 512, 512), GemmOp(1024, 512, 512)
    assert math.isclose(float(((shape_vector(a) - shape_vector(b)) ** 2).sum() ** 0.5), 1.0)
    assert group_key(GemmOp(8, 8, 8, fp32_precision="high")) != group_key(GemmOp(8, 8, 8))
    assert group_key(GemmOp(8, 8, 8, dtype_a="bfloat16", dtype_b="bfloat16")) != group_key(GemmOp(8, 8, 8))
    assert group_key(Conv2dOp(1, 8, 8, 8, 8, 3, 3, layout="nhwc")) != group_key(Conv2dOp(1, 8, 8, 8, 8, 3, 3))
    cfg = PipelineConfig(tile_m=128, tile_n=128)
    assert wave_factor(GemmOp(128 * 10, 128, 64), cfg, 8) == pytest.approx(16 / 10)  # 10 tiles on 8 SMs: 2 waves
    assert wave_factor(GemmOp(128 * 8, 128, 64), cfg, 8) == 1.0
    assert wave_factor(GemmOp(128 * 8, 128, 64), None, 8) == 1.0
    # split-K: each tile's pieces count, at most one wave of them (32 tiles x 4 = 128 pieces on 132 SMs)
    split = cfg.replace(split_k=4)
    assert wave_factor(GemmOp(128 * 4, 128 * 8, 8192), split, 132) == pytest.approx(132 / 128)
    assert wave_factor(GemmOp(128 * 4, 128 * 8, 8192), cfg, 132) == pytest.approx(132 / 32)
    assert wave_factor(GemmOp(128 * 10, 128 * 10, 64), split, 132) == pytest.approx(132 / 100)  # 100 tiles: 1 piece


def test_wave_quantization_weighs_compute_bound_ops_only():
    """The partial-wave factor scales compute-bound GEMMs whole, weight-streaming ones not at all, and
    tiny (latency-bound) ones whole; the roofline estimate applies it that way on GPUs only."""
    from tracea.perfmodel.model import roofline_estimate, wave_weight

    gpu = DeviceProfile(Device("cuda", 0), "g", arch="sm_90a", compute_capability=(9, 0), compute_units=132,
                        warp_size=32, peak_gflops={"bfloat16": 989e3}, bandwidth_gbs=3350.0)
    bf = dict(dtype_a="bfloat16", dtype_b="bfloat16")
    assert wave_weight(GemmOp(8192, 8192, 8192, **bf), gpu) == 1.0               # compute-bound
    assert wave_weight(GemmOp(64, 4096, 4096, trans_b=True, **bf), gpu) == 0.0  # streams 32 MB of weight
    assert wave_weight(GemmOp(239, 236, 225, **bf), gpu) == 1.0                 # under 1 us of memory
    mid = wave_weight(GemmOp(512, 4096, 4096, trans_b=True, **bf), gpu)
    assert 0.0 < mid < 1.0
    cfg = PipelineConfig(tile_m=128, tile_n=128)
    v = _V("pm.roof", 1.0)
    decode, big = GemmOp(64, 4096, 4096, trans_b=True, **bf), GemmOp(128 * 10, 128, 8192, **bf)
    assert roofline_estimate(v, decode, gpu, cfg) == pytest.approx(v.estimate_seconds(decode, gpu, cfg))
    assert roofline_estimate(v, big, gpu, cfg) > v.estimate_seconds(big, gpu, cfg)
    assert roofline_estimate(v, big, _profile(), cfg) == pytest.approx(v.estimate_seconds(big, _profile(), cfg))


def test_wave_quantization_stretches_compute_not_the_launch_cost():
    """A latency-bound op of few tiles: idle SMs stretch its compute time, not the fixed launch cost or the
    memory time -- two variants of one efficiency whose tiles differ 4x in count estimate within their
    compute times of each other (the factor once multiplied the whole estimate: 0.19 vs 0.09 ms for a
    10 us batch-1 conv, ranked by tile count alone)."""
    from tracea.perfmodel.features import roofline_times, wave_factor
    from tracea.perfmodel.model import roofline_estimate

    gpu = DeviceProfile(Device("cuda", 0), "g", arch="sm_90a", compute_capability=(9, 0), compute_units=132,
                        warp_size=32, peak_gflops={"bfloat16": 989e3}, bandwidth_gbs=3350.0)
    op = GemmOp(49, 512, 2048, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")  # 1x1 conv, 7x7 plane, b1
    v = _V("pm.roof", 0.5)
    plain = v.estimate_seconds(op, gpu)
    compute = roofline_times(op, gpu)[0] / 0.5
    for tile in ((64, 64), (128, 256)):
        cfg = PipelineConfig(tile_m=tile[0], tile_n=tile[1])
        f = wave_factor(op, cfg, 132)
        assert f > 10
        assert roofline_estimate(v, op, gpu, cfg) == pytest.approx(plain + (f - 1) * compute)
    cfgs = [PipelineConfig(tile_m=t[0], tile_n=t[1]) for t in ((64, 64), (128, 256))]
    small, large = (roofline_estimate(v, op, gpu, c) for c in cfgs)
    tiles_ratio = wave_factor(op, cfgs[1], 132) / wave_factor(op, cfgs[0], 132)  # 4: what the old form gave
    assert large / small < 0.6 * tiles_ratio


class _V(KernelVariant):
    """A roofline variant (efficiency set per instance)."""

    backend = "pm"

    def __init__(self, name, efficiency, priority=0):
        self.name, self.efficiency, self.priority = name, efficiency, priority
        self.requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}))

    def hero_configs(self, op, profile):  # noqa: ANN001
        return [PipelineConfig(warps=1)]


FAST, SLOW = _V("pm.fast_on_paper", 0.9), _V("pm.fast_in_practice", 0.3)


def _rows(n=6):
    """Measured: 'fast_on_paper' runs 4x slower than 'fast_in_practice' on every square size."""
    rows = []
    for i in range(n):
        s = 256 * 2 ** (i / 2)
        op = GemmOp(int(s), int(s), int(s))
        t = op.flops / 30e9
        rows += [dict(variant=FAST.name, op=op.to_dict(), seconds=4 * t, family="sq", split="fit"),
                 dict(variant=SLOW.name, op=op.to_dict(), seconds=t, family="sq", split="fit")]
    return rows


def _file(tmp_path, rows=None, arch="cpu-intel-avx512", name="cpu-intel-avx512.json"):
    path = tmp_path / name
    path.write_text(json.dumps(pack(_rows() if rows is None else rows, {"backend": "pm", "arch_key": arch})))
    return str(path)


def test_load_and_fit_three_tiers(tmp_path):
    f = load_file(_file(tmp_path))
    assert f.ok and len(f.observations) == 12 and f.skipped_rows == 0
    prof = _profile()
    model = PerfModel.fit(f.arch_key, f.observations, {v.name: v for v in (FAST, SLOW)}, prof)
    near = GemmOp(700, 700, 700)
    ef, es = model.estimate(FAST, near, prof), model.estimate(SLOW, near, prof)
    assert ef.method == es.method == "knn" and ef.seconds > 2.5 * es.seconds and ef.neighbors
    assert ef.roofline_s < es.roofline_s  # the roofline ranked them the other way
    middle = GemmOp(256, 256, 6 * 256)  # K 6x the nearest measured square: calibrated by the shapes around
    e = model.estimate(FAST, middle, prof)
    assert e.method == "calibrated" and e.seconds > 2 * FAST.estimate_seconds(middle, prof)
    far = GemmOp(2, 2, 2)  # nothing measured within a factor of 8: no extrapolation, the roofline
    e = model.estimate(FAST, far, prof)
    assert e.method == "roofline" and e.seconds == pytest.approx(FAST.estimate_seconds(far, prof))
    other = GemmOp(700, 700, 700, fp32_precision="high")
    e = model.estimate(FAST, other, prof)
    assert e.method == "roofline" and e.seconds == pytest.approx(FAST.estimate_seconds(other, prof))
    unknown = _V("pm.unmeasured", 0.5)
    assert model.estimate(unknown, near, prof).method == "roofline"


def test_heldout_rows_are_never_fitted(tmp_path):
    rows = [dict(r, split="heldout") for r in _rows()]
    f = load_file(_file(tmp_path, rows))
    model = PerfModel.fit(f.arch_key, f.observations, {v.name: v for v in (FAST, SLOW)}, _profile())
    assert model.points == 0


@pytest.mark.parametrize("raw,why", [
    ([], "JSON object"), ({"format": "x"}, "format"), ({"format": "tracea-perf-data", "version": 2}, "version"),
    ({"format": "tracea-perf-data", "version": 1, "arch_key": ""}, "arch_key"),
    ({"format": "tracea-perf-data", "version": 1, "arch_key": "a", "columns": ["variant"], "rows": []}, "columns"),
    ({"format": "tracea-perf-data", "version": 1, "arch_key": "a", "columns": ["variant", "op", "seconds"],
      "rows": {}}, "rows"),
])
def test_malformed_files_are_refused_with_a_reason(raw, why):
    f = parse(raw)
    assert not f.ok and why in f.problem


def test_unreadable_and_oversized_files(tmp_path, monkeypatch):
    p = tmp_path / "x.json"
    p.write_bytes(b"\xff\xfe{")
    assert "unreadable" in load_file(p).problem
    assert "unreadable" in load_file(tmp_path / "missing.json").problem
    p.write_text("[" * 100000 + "]" * 100000)
    assert not load_file(p).ok
    from tracea.perfmodel import data

    monkeypatch.setattr(data, "MAX_BYTES", 10)
    assert "bytes" in load_file(_file(tmp_path)).problem


def test_bad_rows_are_skipped():
    good = pack(_rows(1), {"arch_key": "a"})
    good["rows"] += [[FAST.name, {"kind": "gemm", "m": 0, "n": 1, "k": 1}, 1.0], [FAST.name, {"kind": "gemm"}, -1.0],
                     [FAST.name, {"kind": "gemm", "m": 1, "n": 1, "k": 1}, float("inf")], [1, {}, 1.0], "row",
                     [FAST.name, {"kind": "gemm", "m": 1, "n": 1, "k": 1, "bogus": 1}, 1.0], [FAST.name, [], 1.0],
                     [FAST.name, {"kind": "gemm", "m": 1, "n": 1, "k": 1}, True]]
    f = parse(good)
    assert f.ok and len(f.observations) == 2 and f.skipped_rows == 8


def test_user_observations_need_default_time_and_this_device():
    prof = _profile()
    fp = device_fingerprint(prof)
    op = GemmOp(100, 100, 100)
    base = dict(op_key=op.key, variant=FAST.name, fingerprint="f", goal="maximize_tflops",
                config=PipelineConfig(warps=1).to_dict(), median_s=1e-4, op=op.to_dict(), device_fp=fp)
    entries = [CacheEntry.from_json(dict(base, default_s=2e-4)), CacheEntry.from_json(base),
               CacheEntry.from_json(dict(base, default_s=2e-4, device_fp="other")),
               CacheEntry.from_json(dict(base, default_s=2e-4, op={"kind": "nope"}))]
    obs = user_observations(entries, fp)
    assert len(obs) == 1 and obs[0].seconds == 2e-4 and obs[0].weight == 2.0


def test_cache_keeps_default_time(tmp_path):
    cache = TuningCache(tmp_path / "c.json")
    prof = _profile()
    op = GemmOp(64, 64, 64)
    e = cache.make_entry(op, "pm.x", prof, PipelineConfig(warps=1), {"median_s": 1e-5, "default_s": 3e-5})
    assert e.default_s == 3e-5
    assert cache.put(e)
    again = TuningCache(tmp_path / "c.json")
    assert again.entries()[0].default_s == 3e-5
    raw = json.loads((tmp_path / "c.json").read_text())
    assert [e["default_s"] for e in raw["entries"].values()] == [3e-5]
    bad = dict(next(iter(raw["entries"].values())), default_s=-1.0)
    from tracea.tuning.cache_schema import entry_problem

    assert "default_s" in entry_problem(e.key, bad)


class _Plugin:
    def __init__(self, files, variants=(FAST, SLOW)):
        self.files, self.variants = files, list(variants)

    @hookimpl
    def tracea_register_variants(self):  # noqa: ANN201
        return self.variants

    @hookimpl
    def tracea_perf_data(self, profile):  # noqa: ANN001, ANN201
        return self.files if profile.device.kind == "cpu" else None


def _doctor(monkeypatch, plugin):
    monkeypatch.delenv("TRACEA_PERF_MODEL", raising=False)
    monkeypatch.delenv("TRACEA_PERF_DATA", raising=False)
    pm = create_plugin_manager(autoload=False, blocked=[])
    pm.register_plugin(plugin, "pm", "test")
    doc = Doctor(pm)
    prof = doc.profile_for("cpu")
    return doc, prof


def test_doctor_ranks_by_measured_data_and_explains(monkeypatch, tmp_path):
    doc, prof = _doctor(monkeypatch, _Plugin([]))
    path = _file(tmp_path, name="data.json", arch=arch_key(prof))
    doc, prof = _doctor(monkeypatch, _Plugin([path]))
    op = GemmOp(700, 700, 700)
    d = doc.decide(op, "cpu", use_cache=False)
    assert d.variant.name == SLOW.name
    text = d.explain()
    assert "performance model for" in text and "data.json (12 points" in text and "knn:" in text
    monkeypatch.setenv("TRACEA_PERF_MODEL", "0")
    d = doc.decide(op, "cpu", use_cache=False)
    assert d.variant.name == FAST.name and "TRACEA_PERF_MODEL=0" in d.explain()


def test_doctor_without_matching_data_says_so(monkeypatch, tmp_path):
    path = _file(tmp_path, arch="cpu-some-other-cpu")
    doc, _ = _doctor(monkeypatch, _Plugin([path]))
    d = doc.decide(GemmOp(700, 700, 700), "cpu", use_cache=False)
    assert d.variant.name == FAST.name
    assert "data exists for cpu-some-other-cpu" in d.explain()


def test_corrupt_data_file_never_breaks_dispatch(monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "tracea-perf-data", "version": 1, "arch_key": 5}')
    doc, _ = _doctor(monkeypatch, _Plugin([str(bad), str(tmp_path / "absent.json")]))
    d = doc.decide(GemmOp(700, 700, 700), "cpu", use_cache=False)
    assert d.variant.name == FAST.name
    assert "bad.json not used: arch_key" in d.explain() and "absent.json not used: unreadable" in d.explain()


def test_a_raising_hook_or_model_falls_back(monkeypatch):
    class Raising(_Plugin):
        @hookimpl
        def tracea_perf_data(self, profile):  # noqa: ANN001, ANN201
            raise RuntimeError("boom")

    doc, _ = _doctor(monkeypatch, Raising([]))
    d = doc.decide(GemmOp(70, 70, 70), "cpu", use_cache=False)
    assert d.variant.name == FAST.name
    monkeypatch.setattr(perfmodel, "build", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad model")))
    doc.invalidate()
    d = doc.decide(GemmOp(71, 70, 70), "cpu", use_cache=False)
    assert d.variant.name == FAST.name and "model not built: ValueError" in d.explain()


def test_user_tuning_records_refresh_the_model(monkeypatch, tmp_path):
    doc, prof = _doctor(monkeypatch, _Plugin([]))
    cache = TuningCache(tmp_path / "cache.json")
    op = GemmOp(300, 300, 300)
    assert doc.decide(op, "cpu", use_cache=False).variant.name == FAST.name
    monkeypatch.setattr("tracea.doctor.doctor._tuning_cache", lambda: cache)
    near = GemmOp(320, 300, 300)  # measured on a neighbouring shape: FAST's default ran 10x its estimate
    cache.put(cache.make_entry(near, FAST, prof, PipelineConfig(warps=1),
                               {"median_s": 1.0, "default_s": 10 * FAST.estimate_seconds(near, prof)}),
              cache.make_entry(near, SLOW, prof, PipelineConfig(warps=1),
                               {"median_s": 1.0, "default_s": SLOW.estimate_seconds(near, prof)}))
    d = doc.decide(op, "cpu")
    assert d.variant.name == SLOW.name, d.explain()
    assert "your tuning cache (2 points)" in d.explain()


def test_cache_changes_without_user_data_do_not_refit(monkeypatch, tmp_path):
    """An entry without a default-config time (an arbiter verdict, a tuned config) leaves the model as it
    was; one with a default time refits it."""
    doc, prof = _doctor(monkeypatch, _Plugin([]))
    cache = TuningCache(tmp_path / "cache.json")
    monkeypatch.setattr("tracea.doctor.doctor._tuning_cache", lambda: cache)
    fits = []
    build = perfmodel.build
    monkeypatch.setattr(perfmodel, "build", lambda *a, **k: fits.append(1) or build(*a, **k))
    op = GemmOp(300, 300, 300)
    doc.decide(op, "cpu")
    assert len(fits) == 1
    cache.put(cache.make_entry(GemmOp(64, 64, 64), FAST, prof, PipelineConfig(warps=1), {"median_s": 1.0}))
    doc.decide(GemmOp(301, 300, 300), "cpu")
    assert len(fits) == 1, "refitted without new user data"
    near = GemmOp(320, 300, 300)
    cache.put(cache.make_entry(near, SLOW, prof, PipelineConfig(warps=1),
                               {"median_s": 1.0, "default_s": SLOW.estimate_seconds(near, prof)}))
    d = doc.decide(GemmOp(302, 300, 300), "cpu")
    assert len(fits) == 2 and "your tuning cache (1 points)" in d.explain()


def test_data_of_another_device_of_the_arch_scale_to_this_ones_roofline(tmp_path):
    """Rows measured on a device with half this one's bandwidth (H100 data on an H200) estimate this device's
    memory-bound ops at this device's roofline times the measured efficiency, not at the measured seconds;
    without a recorded profile (or with a bad one) the rows are read against this device's roofline."""
    from tracea.perfmodel import build

    here = _profile().with_(bandwidth_gbs=40.0, peak_gflops={"float32": 1e9})  # memory-bound GEMMs
    v = _V("pm.stream", 0.5)
    op = GemmOp(1, 4096, 4096)
    rows = [dict(variant=v.name, op=GemmOp(1, n, 4096).to_dict(), seconds=2 * GemmOp(1, n, 4096).min_bytes / 20e9,
                 family="gemv", split="fit") for n in (2048, 3072, 4096, 6144)]
    def model(recorded):
        raw = pack(rows, {"backend": "pm", "arch_key": "cpu-intel-avx512"})
        if recorded is not None:
            raw["profile"] = recorded
        path = tmp_path / "cpu-intel-avx512.json"
        path.write_text(json.dumps(raw))
        return build(here, {v.name: v}, [load_file(str(path))])
    on_slower = model(dict(here.to_dict(), bandwidth_gbs=20.0)).estimate(v, op, here)
    as_is = model(None).estimate(v, op, here)
    assert on_slower.method == as_is.method == "knn"
    assert as_is.seconds == pytest.approx(2 * op.min_bytes / 20e9, rel=0.05)  # the measured seconds
    assert on_slower.seconds == pytest.approx(as_is.seconds / 2, rel=0.05)  # half: this device streams 2x faster
    for bad in ({"bandwidth_gbs": -1.0}, {"bandwidth_gbs": "fast", "peak_gflops": {"float32": float("nan")}}, []):
        assert model(bad).estimate(v, op, here).seconds == pytest.approx(as_is.seconds)
    # two files of one name measured on different devices (a user's own on TRACEA_PERF_DATA): each is read
    # against its own device, whichever comes last
    (tmp_path / "b").mkdir()
    files = []
    for sub, bw in (("", 20.0), ("b", 40.0)):
        raw = dict(pack(rows, {"backend": "pm", "arch_key": "cpu-intel-avx512"}), profile={"bandwidth_gbs": bw})
        path = tmp_path / sub / "cpu-intel-avx512.json"
        path.write_text(json.dumps(raw))
        files.append(load_file(str(path)))
    mixed = build(here, {v.name: v}, files).estimate(v, op, here)
    assert on_slower.seconds < mixed.seconds < as_is.seconds  # between the two readings, not either alone
