"""Runtime discovery, device selection, program building, the array adapter and the plugin hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tracea.errors import CompilationError, InvalidArgumentError
from tracea.ir.device import Device

PROBE = textwrap.dedent("""
    import json, sys
    import tracea_opencl.plugin as plugin
    from tracea.ir.ops import GemmOp
    from tracea_opencl.gemm import OpenCLGemm
    from tracea.doctor.host_plugin import host_profile
    info = plugin.tracea_backend_info()
    reasons = OpenCLGemm().check(GemmOp(8, 8, 8), host_profile())
    print(json.dumps({"available": info.available, "reason": info.reason, "check": reasons,
                      "profiles": len(plugin.tracea_device_profiles())}))
""")


def _probe(env_changes: dict, prelude: str = "") -> dict:
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run([sys.executable, "-c", prelude + PROBE], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_platform_makes_backend_unavailable_with_reason(tmp_path):
    empty = tmp_path / "vendors"
    empty.mkdir()
    res = _probe({"OCL_ICD_VENDORS": str(empty), "TRACEA_OPENCL_ICD_DIR": None, "OCL_ICD_FILENAMES": None})
    assert res["available"] is False
    assert "no OpenCL platform" in res["reason"] and "setup_opencl_runtime.sh" in res["reason"]
    assert res["check"] == [res["reason"]]
    assert res["profiles"] == 0


def test_missing_pyopencl_makes_backend_unavailable_with_reason():
    blocker = textwrap.dedent("""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "pyopencl" or name.startswith("pyopencl."):
                    raise ImportError("pyopencl blocked for this test")
        sys.meta_path.insert(0, _Block())
    """)
    res = _probe({}, prelude=blocker)
    assert res["available"] is False
    assert "pip install pyopencl" in res["reason"]
    assert res["profiles"] == 0


def test_import_does_not_load_pyopencl():
    code = "import sys, tracea_opencl.plugin, tracea_opencl; print('pyopencl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.opencl
def test_icd_dir_variable_is_honoured(cl_profile):
    icd_dir = os.environ.get("TRACEA_OPENCL_ICD_DIR") or os.environ.get("OCL_ICD_VENDORS")
    if not icd_dir:
        pytest.skip("the OpenCL runtime here is not registered through an ICD directory")
    res = _probe({"OCL_ICD_VENDORS": None, "OCL_ICD_FILENAMES": None, "TRACEA_OPENCL_ICD_DIR": icd_dir})
    assert res["available"] is True and res["profiles"] >= 1
    assert res["check"] and "runs on opencl devices" in res["check"][0]


@pytest.mark.opencl
def test_profiles_and_selection(cl_profile, monkeypatch):
    import tracea_opencl
    from tracea_opencl import runtime

    profiles = tracea_opencl.device_profiles()
    assert [p.device for p in profiles] == [Device.opencl(i) for i in range(len(profiles))]
    p0 = profiles[0]
    assert p0.backend == "opencl" and p0.compute_units >= 1 and p0.max_threads_per_block >= 1
    assert p0.shared_mem_per_block > 0 and p0.driver_version and p0.runtime_version
    assert any(f.startswith("opencl:") for f in p0.isa)
    assert runtime.resolve(0) == Device.opencl(0)
    assert runtime.resolve("opencl:0") == Device.opencl(0)
    assert runtime.resolve(p0.name[:4]) == Device.opencl(0)
    monkeypatch.setenv(runtime.DEVICE_ENV, "0")
    assert runtime.resolve(None) == Device.opencl(0)
    with pytest.raises(InvalidArgumentError, match="device"):
        runtime.resolve("no-such-device-xyz")
    with pytest.raises(InvalidArgumentError, match="index below"):
        runtime.resolve(len(profiles))


@pytest.mark.opencl
def test_build_error_carries_the_build_log(cl_profile):
    from tracea_opencl import programs, runtime

    ctx, queue = runtime.context_queue(cl_profile.device)
    bad = "__kernel void broken(__global float *a) { a[0] = undeclared_identifier_xyz; }"
    with pytest.raises(CompilationError) as err:
        programs.build(ctx, queue.device, bad)
    assert err.value.backend == "opencl"
    assert "undeclared_identifier_xyz" in err.value.log


@pytest.mark.opencl
def test_program_cache_hits(cl_profile):
    from tracea_opencl import programs, runtime

    ctx, queue = runtime.context_queue(cl_profile.device)
    src = "__kernel void cache_probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"
    first = programs.build(ctx, queue.device, src)
    before = programs.stats()["hits"]
    assert programs.build(ctx, queue.device, src) is first
    assert programs.stats()["hits"] == before + 1


@pytest.mark.opencl
def test_array_adapter(cl_profile):
    from tracea.dtypes import DType
    from tracea_opencl.arrays import PyOpenCLAdapter

    ad = PyOpenCLAdapter()
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = ad.from_numpy(host, cl_profile.device)
    assert ad.owns(arr) and not ad.owns(host)
    info = ad.info(arr)
    assert info.shape == (3, 4) and info.dtype is DType.F32 and info.device == cl_profile.device
    assert info.c_contiguous
    np.testing.assert_array_equal(ad.to_host(arr), host)
    t = ad.swap_last(arr)
    assert not ad.info(t).c_contiguous
    np.testing.assert_array_equal(ad.to_host(ad.contiguous(t)), host.T)
    e = ad.empty((2, 5), DType.F16, like=arr)
    assert ad.info(e).shape == (2, 5) and ad.info(e).dtype is DType.F16
    dst = ad.empty((3, 4), DType.F32, like=arr)
    ad.copy_(dst, arr)
    np.testing.assert_array_equal(ad.to_host(dst), host)


@pytest.mark.opencl
def test_hooks_environment_synchronize_measure(cl_profile, oracle):
    import tracea_opencl.plugin as plugin
    from tracea.doctor.variant import OpArgs
    from tracea.ir.ops import GemmOp
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.gemm import OpenCLGemm

    env = plugin.tracea_environment(cl_profile)
    assert env["opencl_driver"] == cl_profile.driver_version
    assert plugin.tracea_environment(cl_profile.with_(device=Device.cpu())) is None
    info = plugin.tracea_backend_info()
    assert info.available and "opencl:0" in info.details
    op = GemmOp(40, 48, 24)
    variant = OpenCLGemm()
    cfg = variant.hero_configs(op, cl_profile)[0]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal((24, 48)).astype(np.float32)
    out = oracle.poisoned((40, 48), np.float32, cl_profile.device)
    args = OpArgs({"a": to_device(a, cl_profile.device), "b": to_device(b, cl_profile.device), "bias": None},
                  out, PyOpenCLAdapter())
    times = plugin.tracea_measure(variant=variant, op=op, config=cfg, args=args, profile=cl_profile,
                                  warmup=1, repeats=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    plugin.tracea_synchronize(cl_profile.device)
    assert oracle.rel_error(out.get(), a.astype(np.float64) @ b) < 1e-5
    assert plugin.tracea_measure(variant=object(), op=op, config=cfg, args=args, profile=cl_profile,
                                 warmup=0, repeats=1) is None


@pytest.mark.opencl
def test_numpy_arrays_are_refused_with_a_hint(cl_profile):
    from tracea.doctor.variant import OpArgs
    from tracea.errors import UnsupportedDeviceError
    from tracea.ir.ops import GemmOp
    from tracea.runtime.arrays import NumpyAdapter
    from tracea_opencl.gemm import OpenCLGemm

    op = GemmOp(4, 4, 4)
    a = np.ones((4, 4), np.float32)
    args = OpArgs({"a": a, "b": a, "bias": None}, np.empty((4, 4), np.float32), NumpyAdapter())
    variant = OpenCLGemm()
    with pytest.raises(UnsupportedDeviceError, match="to_device"):
        variant.run(op, variant.hero_configs(op, cl_profile)[0], args, cl_profile)


def test_setup_script_usage():
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "ci" / "setup_opencl_runtime.sh"
    ok = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "OCL_ICD_VENDORS" in ok.stdout
    bad = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
