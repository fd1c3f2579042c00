"""Hook-spec contract tests: every hook is documented (docstring and plugin guide) and has a test here
named test_hook_<name>; discovery, blocking, autoload switch and broken plugins behave as documented."""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import numpy as np

from tracea import GemmOp, LayerType, PipelineConfig, SearchSpace
from tracea.doctor import Doctor, DeviceProfile, KernelVariant, Requirements
from tracea.ir import Device
from tracea.plugins import BackendInfo, create_plugin_manager, hookimpl, hookspecs
from tracea.runtime import fallbacks

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "plugin-guide.md"
HOOKS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("tracea_") and callable(f))


def test_every_hook_has_a_contract_docstring():
    assert len(HOOKS) >= 10
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert len(doc) > 120, f"{name} needs a full docstring"
        assert "Implemented by" in doc, f"{name}: say who implements it"
        spec = getattr(hookspecs, name)
        if getattr(spec, "tracea_spec", {}).get("firstresult"):
            assert "Stops at first non-None result" in doc, name


def test_every_hook_and_argument_is_in_the_plugin_guide():
    text = GUIDE.read_text()
    for name in HOOKS:
        assert f"`{name}`" in text, f"{name} missing from docs/plugin-guide.md"
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}`"))
        for arg in inspect.signature(getattr(hookspecs, name)).parameters:
            assert f"`{arg}`" in row, f"argument {arg} of {name} missing from the guide's table"


def test_every_hook_has_a_test():
    tested = {n[len("test_hook_"):] for n in globals() if n.startswith("test_hook_")}
    missing = [h for h in HOOKS if h not in tested]
    assert not missing, f"hooks without test_hook_<name>: {missing}"


# -- a test plugin exercising every hook -------------------------------------------------------------

class _Toy(KernelVariant):
    name = "toy.gemm"
    backend = "toy"
    description = "test variant"
    efficiency = 1.0
    requirements = Requirements("toydev", LayerType.GEMM)
    ran: list = []

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=8)]

    def search_space(self, op, profile):
        return SearchSpace().tile_m([8, 16])

    def run(self, op, config, args, profile):
        self.ran.append(config)
        args.host("out")[...] = args.host("a") @ args.host("b")


def _toy_plugin(**extra):
    mod = types.ModuleType("toy_plugin")
    calls: list[str] = []

    @hookimpl
    def tracea_backend_info():
        return BackendInfo("toy", "0.1.0", package="toy")

    @hookimpl
    def tracea_register_variants():
        return [_Toy()]

    @hookimpl
    def tracea_device_profiles():
        return [DeviceProfile(Device("toydev"), "Toy Device", backend="toy", peak_gflops={"float32": 1e6})]

    @hookimpl
    def tracea_environment(profile):
        return {"toy_driver": "42"} if profile.device.kind == "toydev" else None

    @hookimpl
    def tracea_synchronize(device):
        calls.append(f"sync {device}")

    for f in (tracea_backend_info, tracea_register_variants, tracea_device_profiles, tracea_environment,
              tracea_synchronize):
        setattr(mod, f.__name__, f)
    for name, f in extra.items():
        setattr(mod, name, f)
    mod.calls = calls
    return mod


def _doctor(plugin) -> Doctor:
    pm = create_plugin_manager(autoload=False)
    pm.register(plugin, name="toy")
    return Doctor(pm)


OP = GemmOp(8, 8, 8)


def test_hook_tracea_backend_info():
    d = _doctor(_toy_plugin())
    assert "toy" in [b.name for b in d.backends()]
    assert not d.version_mismatches() or all("toy" not in m for m in d.version_mismatches())


def test_hook_tracea_register_variants():
    d = _doctor(_toy_plugin())
    assert d.registry.get("toy.gemm") is not None
    decision = d.decide(OP, "toydev:0")
    assert decision.variant.name == "toy.gemm" and decision.config.tile_m == 8


def test_hook_tracea_device_profiles():
    d = _doctor(_toy_plugin())
    assert d.profile_for("toydev").name == "Toy Device"
    assert d.profiles()[0].device == Device.cpu()  # host first


def test_hook_tracea_environment():
    d = _doctor(_toy_plugin())
    assert d.environment(d.profile_for("toydev")) == {"toy_driver": "42"}
    assert "toy_driver" not in d.environment(d.profile_for("cpu"))


def test_hook_tracea_perf_data(tmp_path):
    from tracea.perfmodel import arch_key
    from tracea.perfmodel.data import pack

    toy = DeviceProfile(Device("toydev"), "Toy Device", backend="toy", peak_gflops={"float32": 1e6})
    rows = [dict(variant="toy.gemm", op=GemmOp(s, s, s).to_dict(), seconds=1e-3 * s) for s in (8, 16)]
    path = tmp_path / "toy.json"
    path.write_text(__import__("json").dumps(pack(rows, {"arch_key": arch_key(toy)})))
    seen = []

    @hookimpl
    def tracea_perf_data(profile):
        seen.append(profile.device.kind)
        return [str(path)] if profile.device.kind == "toydev" else None

    d = _doctor(_toy_plugin(tracea_perf_data=tracea_perf_data))
    decision = d.decide(OP, "toydev", use_cache=False)
    assert decision.chosen.estimate.method == "knn" and "toy.json (2 points" in decision.explain()
    assert seen == ["toydev"]


def test_hook_tracea_synchronize():
    plugin = _toy_plugin()
    d = _doctor(plugin)
    d.pm.hook.tracea_synchronize(device=Device("toydev"))
    assert plugin.calls == ["sync toydev:0"]


def test_hook_tracea_search_space():
    @hookimpl
    def tracea_search_space(variant, op, profile):
        return SearchSpace().tile_m([32]) if variant.name == "toy.gemm" else None

    d = _doctor(_toy_plugin())
    v = d.registry.get("toy.gemm")
    assert [c.tile_m for c in d.search_space(v, OP, d.profile_for("toydev"))] == [8, 16]  # variant default
    d2 = _doctor(_toy_plugin(tracea_search_space=tracea_search_space))
    assert [c.tile_m for c in d2.search_space(v, OP, d2.profile_for("toydev"))] == [32]  # plugin override wins


def test_hook_tracea_hero_configs():
    @hookimpl
    def tracea_hero_configs(variant, op, profile):
        return [PipelineConfig(tile_m=64)]

    d = _doctor(_toy_plugin(tracea_hero_configs=tracea_hero_configs))
    v = d.registry.get("toy.gemm")
    heroes = d.hero_configs(v, OP, d.profile_for("toydev"))
    assert [c.tile_m for c in heroes] == [64, 8]  # plugins first, the variant's own last, deduplicated


def test_hook_tracea_prepare_variant():
    seen = []

    @hookimpl
    def tracea_prepare_variant(variant, op, config, profile):
        seen.append(("prepare", config.tile_m))
        return "handle"

    d = _doctor(_toy_plugin(tracea_prepare_variant=tracea_prepare_variant))
    from tracea.doctor.variant import OpArgs
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.runtime.dispatch import run_decision

    a = np.ones((8, 8), np.float32)
    out = np.zeros((8, 8), np.float32)
    run_decision(d.decide(OP, "toydev"), OpArgs({"a": a, "b": a}, out, NumpyAdapter()), d)
    assert seen == [("prepare", 8)] and out[0, 0] == 8


def test_hook_tracea_run_variant():
    @hookimpl
    def tracea_run_variant(variant, op, config, args, profile):
        if variant.backend != "toy":
            return None
        args.host("out")[...] = -1.0
        return True

    d = _doctor(_toy_plugin(tracea_run_variant=tracea_run_variant))
    from tracea.doctor.variant import OpArgs
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.runtime.dispatch import run_decision

    out = np.zeros((8, 8), np.float32)
    a = np.ones((8, 8), np.float32)
    run_decision(d.decide(OP, "toydev"), OpArgs({"a": a, "b": a}, out, NumpyAdapter()), d)
    assert np.all(out == -1.0)  # the plugin's implementation ran instead of variant.run


def test_hook_tracea_bind_variant():
    """A plugin's launcher is bound once per signature and called on every call with the inputs in
    op.roles order and the output."""
    calls = []

    @hookimpl
    def tracea_bind_variant(variant, op, config, profile, adapter):
        if variant.backend != "toy":
            return None
        calls.append("bind")

        def launch(a, b, bias, out):
            calls.append("launch")
            adapter.to_numpy(out)[...] = adapter.to_numpy(a) @ adapter.to_numpy(b) + 1.0

        return launch

    d = _doctor(_toy_plugin(tracea_bind_variant=tracea_bind_variant))
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.runtime.dispatch import bind

    v = d.registry.get("toy.gemm")
    launch = bind(v, OP, PipelineConfig(), d.profile_for("toydev"), NumpyAdapter(), d)
    a = np.ones((8, 8), np.float32)
    out = np.zeros((8, 8), np.float32)
    launch(a, a, None, out)
    launch(a, a, None, out)
    assert calls == ["bind", "launch", "launch"] and np.all(out == 9.0)


def test_hook_tracea_measure():
    @hookimpl
    def tracea_measure(variant, op, config, args, profile, warmup, repeats):
        return [1e-3] * repeats

    d = _doctor(_toy_plugin(tracea_measure=tracea_measure))
    v = d.registry.get("toy.gemm")
    times = d.pm.hook.tracea_measure(variant=v, op=OP, config=PipelineConfig(), args=None,
                                     profile=d.profile_for("toydev"), warmup=1, repeats=3)
    assert times == [1e-3] * 3


def test_hook_tracea_array_adapters():
    from tracea.runtime.arrays import ArrayAdapter, ArrayInfo

    class Boxed:
        def __init__(self, arr):
            self.arr = arr

    class BoxAdapter(ArrayAdapter):
        name = "box"
        priority = 50

        def owns(self, obj):
            return isinstance(obj, Boxed)

        def info(self, obj):
            i = ArrayInfo(obj.arr.shape, tuple(s // obj.arr.itemsize for s in obj.arr.strides), "float32", Device.cpu(), "box")
            from tracea.dtypes import DType
            return ArrayInfo(i.shape, i.strides, DType.F32, i.device, i.adapter)

        def empty(self, shape, dtype, like):
            return Boxed(np.empty(shape, dtype.numpy))

        def reshape(self, obj, shape):
            return Boxed(obj.arr.reshape(shape))

        def to_numpy(self, obj):
            return obj.arr

    @hookimpl
    def tracea_array_adapters():
        return [BoxAdapter()]

    d = _doctor(_toy_plugin(tracea_array_adapters=tracea_array_adapters))
    names = [a.name for a in d.adapters()]  # other installed plugins (torch) may rank higher still
    assert names.index("box") < names.index("numpy")
    from tracea.runtime import operands

    adapter, device, found = operands.operands(d, [("a", Boxed(np.ones((2, 2), np.float32)))])
    assert adapter.name == "box" and device == Device.cpu() and found["a"].info.c_contiguous


def test_hook_tracea_fallback_run():
    fallbacks.reset()

    @hookimpl
    def tracea_fallback_run(op, arrays, out, reason):
        return "computed elsewhere"

    d = _doctor(_toy_plugin(tracea_fallback_run=tracea_fallback_run))
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.runtime.dispatch import fallback, runner

    int_op = GemmOp(8, 8, 8, dtype_a="int8", dtype_b="int8")  # no variant serves int8
    run, result = runner(int_op, Device.cpu(), NumpyAdapter(), {}, None, doctor=d)
    assert result == "computed elsewhere" and run.launch is None and "int8" in run.reason
    assert fallback(run, {}, None, d) == "computed elsewhere"  # what every later call of the plan runs
    counted = fallbacks.counts()
    assert sum(counted.values()) == 2 and next(iter(counted))[0] == "gemm"
    fallbacks.reset()
    run, result = runner(int_op, Device.cpu(), NumpyAdapter(), {}, None, doctor=d)
    counted = fallbacks.counts()
    assert sum(counted.values()) == 1 and next(iter(counted))[0] == "gemm"
    assert "int8" in next(iter(counted))[1]


# -- discovery -------------------------------------------------------------------------------------

def test_env_plugin_list_block_and_broken(monkeypatch, tmp_path):
    pkg = tmp_path / "envplug.py"
    pkg.write_text("from tracea.plugins import hookimpl, BackendInfo\n"
                   "@hookimpl\ndef tracea_backend_info():\n    return BackendInfo('envplug', '0.1.0')\n")
    (tmp_path / "brokenplug.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRACEA_PLUGINS", "envplug,broken=brokenplug")
    monkeypatch.delenv("TRACEA_BLOCK_PLUGINS", raising=False)
    pm = create_plugin_manager(autoload=False)
    assert pm.has_plugin("envplug") and pm.sources["envplug"] == "env"
    assert "RuntimeError: boom" in pm.load_errors["broken"]
    monkeypatch.setenv("TRACEA_BLOCK_PLUGINS", "envplug")
    pm = create_plugin_manager(autoload=False)
    assert not pm.has_plugin("envplug")
    sys.modules.pop("envplug", None)


def test_duplicate_variant_names_are_reported():
    plugin = _toy_plugin()
    d = _doctor(plugin)
    other = _toy_plugin()
    d.pm.register(other, name="toy2")
    names = d.registry.names()
    assert names.count("toy.gemm") == 1
    assert any("duplicate variant name 'toy.gemm'" in e for e in d.registry_errors)


def test_trace_env_prints_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("TRACEA_TRACE_PLUGINS", "1")
    pm = create_plugin_manager(autoload=False)
    pm.hook.tracea_backend_info()
    assert re.search(r"tracea_backend_info", capsys.readouterr().err)


def test_adapter_declining_the_oracle_gets_the_framework_fallback(monkeypatch):
    monkeypatch.setenv("TRACEA_PLUGINS", "")  # no CPU backend: only the reference serves cpu ops
    from tracea.runtime.arrays import NumpyAdapter
    from tracea.runtime.dispatch import runner

    class NoOracle(NumpyAdapter):
        def allows_fallback_only(self):
            return False

    fallbacks.reset()

    @hookimpl
    def tracea_fallback_run(op, arrays, out, reason):
        out[...] = 7.0
        return out

    d = _doctor(_toy_plugin(tracea_fallback_run=tracea_fallback_run))
    a = np.ones((8, 8), np.float32)
    out = np.zeros((8, 8), np.float32)
    run, _ = runner(OP, Device.cpu(), NoOracle(), {"a": a, "b": a, "bias": None}, out, doctor=d)
    assert np.all(out == 7.0) and run.launch is None  # only the reference served cpu: the framework computed it
    assert "only the reference oracle" in next(iter(fallbacks.counts()))[1]
    out[...] = 0
    run, _ = runner(OP, Device.cpu(), NumpyAdapter(), {"a": a, "b": a, "bias": None}, out, doctor=d)
    run.launch(a, a, None, out)
    assert np.all(out == 8.0) and run.variant == "reference.gemm_blas"  # NumPy arrays accept the reference backend


def test_hook_tracea_kernel_runner(no_env_plugin_list):
    import pytest

    from tracea.errors import UnsupportedDeviceError
    from tracea.usertune.runner import get_runner

    mod = types.ModuleType("toy_runner_plugin")
    seen = []

    @hookimpl
    def tracea_kernel_runner(lang, device, options):
        seen.append((lang, device, options))
        return ("toy-runner", device, options.get("platform")) if lang == "C" else None

    mod.tracea_kernel_runner = tracea_kernel_runner
    pm = create_plugin_manager(autoload=False)
    pm.register(mod, name="toyrunner")
    assert get_runner("C", 3, {"platform": 1}, pm=pm) == ("toy-runner", 3, 1)
    with pytest.raises(UnsupportedDeviceError, match="install"):
        get_runner("OPENCL", 0, {}, pm=pm)
    assert [s[0] for s in seen] == ["C", "OPENCL"]


def test_fallback_counting_cells_add_into_the_counters():
    """A hot path's counting cell (fallbacks.counter) is one shared cell per (kind, reason); counts() adds
    it to what record() counted, and reset() zeroes it in place (callers keep their cell)."""
    fallbacks.reset()
    cell = fallbacks.counter("conv2d", "cell test")
    assert fallbacks.counter("conv2d", "cell test") is cell
    fallbacks.record("conv2d", "cell test")
    cell[0] += 2
    assert fallbacks.counts()[("conv2d", "cell test")] == 3
    fallbacks.reset()
    assert ("conv2d", "cell test") not in fallbacks.counts()
    cell[0] += 1
    assert fallbacks.counts() == {("conv2d", "cell test"): 1}
    fallbacks.reset()
