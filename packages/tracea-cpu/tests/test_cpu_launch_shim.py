"""The compiled launch shim (tracea_cpu.launch_shim): built from Python's headers, called on NumPy arrays,
addresses and None, the same results as the ctypes path, and a clean ctypes fallback when it is off or
cannot be built."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tracea
from tracea.runtime import plans
from tracea_cpu import launch_shim, variant_base
from tracea_cpu.host_load import thread_picker
from tracea_cpu.toolchain import compiler_or_reason

cc, why = compiler_or_reason()
pytestmark = pytest.mark.skipif(cc is None, reason=f"no C compiler: {why}")

try:
    launch_shim._includes()
    HEADERS = ""
except OSError as exc:
    HEADERS = str(exc)
needs_shim = pytest.mark.skipif(bool(HEADERS), reason=f"no Python headers: {HEADERS}")


@pytest.fixture
def fresh_shim():
    """The shim's state forgotten for the test (and restored after it)."""
    saved = dict(launch_shim._state)
    launch_shim._state.clear()
    yield
    launch_shim._state.clear()
    launch_shim._state.update(saved)


def _sum_lib(bias_first: bool = False):
    """A ctypes entry of the shim's shape: ``c = a + b (+ d)`` over ``p[0]`` floats; its pointers are
    ``(p, a, b, c, d)``, or ``(p, a, b, d, c)`` with ``bias_first`` (as conv2d's entry)."""
    from tracea_cpu.toolchain import build

    lib = build(r"""
int tr_test_add(const long *p, const float *a, const float *b, float *c, const float *d) {
    if (p == 0 || a == 0 || b == 0 || c == 0) return 7;
    for (long i = 0; i < p[0]; i++) c[i] = a[i] + b[i] + (d ? d[i] : 0.0f);
    return 0;
}
int tr_test_add_bias_first(const long *p, const float *a, const float *b, const float *d, float *c) {
    return tr_test_add(p, a, b, c, d);
}
""", (), "test-shim-add")
    for fn in (lib.tr_test_add, lib.tr_test_add_bias_first):
        fn.argtypes = [ctypes.c_void_p] * 5
        fn.restype = ctypes.c_int
    return lib.tr_test_add_bias_first if bias_first else lib.tr_test_add


@needs_shim
def test_shim_calls_entry_on_arrays_addresses_and_none(fresh_shim):
    fn = _sum_lib()
    shim = launch_shim.entry_point(fn)
    assert shim is not None and launch_shim.status() == "in use"
    call5, entry = shim
    rng = np.random.default_rng(0)
    n = 37
    a, b, d = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    params = (ctypes.c_long * 1)(n)
    block = ctypes.addressof(params)
    out = np.full(n, np.nan, np.float32)
    assert call5(entry, block, a, b, out, None) == 0
    np.testing.assert_array_equal(out, a + b)
    out2 = np.full(n, np.nan, np.float32)  # addresses (what torch tensors pass) and a read-only input
    d.flags.writeable = False
    assert call5(entry, block, a.ctypes.data, b, out2.ctypes.data, d) == 0
    np.testing.assert_array_equal(out2, a + b + d)
    view = np.arange(2 * n, dtype=np.float32)[n:]  # an offset view: its own data pointer, not the base's
    out3 = np.empty(n, np.float32)
    assert call5(entry, block, view, view, out3, None) == 0
    np.testing.assert_array_equal(out3, 2 * view)
    assert call5(entry, block, None, b, out, None) == 7  # NULL reaches the kernel as NULL
    with pytest.raises(TypeError, match="launch shim"):
        call5(entry, block, [1.0], b, out, None)
    with pytest.raises(TypeError):
        call5(entry, block, a, b, out)
    with pytest.raises(ValueError):
        call5(0, block, a, b, out, None)


@needs_shim
def test_entry_point_only_for_five_pointer_entries(fresh_shim):
    fn = _sum_lib()
    assert launch_shim.entry_point(fn) is not None
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    assert launch_shim.entry_point(fn) is None
    fn.argtypes = [ctypes.c_void_p] * 5
    fn.restype = ctypes.c_long
    assert launch_shim.entry_point(fn) is None
    assert launch_shim.entry_point(lambda *a: 0) is None


def test_shim_off_by_env_keeps_ctypes(monkeypatch, fresh_shim):
    monkeypatch.setenv("TRACEA_CPU_SHIM", "0")
    assert launch_shim.status().startswith("off")
    fn = _sum_lib()
    assert launch_shim.entry_point(fn) is None
    assert launch_shim.module() is None


def test_missing_headers_fall_back(monkeypatch, tmp_path, fresh_shim):
    monkeypatch.setattr(launch_shim.sysconfig, "get_paths", lambda: {"include": str(tmp_path),
                                                                        "platinclude": str(tmp_path)})
    assert "Python.h" in launch_shim.status()
    assert launch_shim.module() is None
    assert "ctypes" in launch_shim.status()
    # launchers then call through ctypes and compute the same thing
    a = np.random.default_rng(1).standard_normal((9, 7)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((7, 5)).astype(np.float32)
    plans.invalidate("test")
    np.testing.assert_allclose(tracea.ops.matmul(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


class _Adapter:
    """The launcher's adapter: NumPy arrays as they are (name 'numpy') or addresses."""

    def __init__(self, name):
        self.name = name

    @staticmethod
    def data_ptr(x):
        return None if x is None else x.ctypes.data


@needs_shim
@pytest.mark.parametrize("adapter", ["numpy", "other"])
@pytest.mark.parametrize("bias_before_out", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
def test_pointer_launcher_through_shim_matches_ctypes(fresh_shim, monkeypatch, adapter, bias_before_out,
                                                         has_bias):
    fn = _sum_lib(bias_first=bias_before_out)
    n = 19
    rng = np.random.default_rng(3)
    a, b, d = (rng.standard_normal(n).astype(np.float32) for _ in range(3))

    def run(shim_on: bool):
        monkeypatch.setenv("TRACEA_CPU_SHIM", "1" if shim_on else "0")
        launch_shim._state.clear()
        params = (ctypes.c_long * 2)(n, 1)
        launch = variant_base.pointer_launcher(fn, params, 1, tracea.PipelineConfig(), _Adapter(adapter),
                                               has_bias, "test", bias_before_out=bias_before_out)
        assert (getattr(launch, "keepalive", None) is not None) == shim_on
        out = np.full(n, np.nan, np.float32)
        launch(a, b, d, out)
        return out

    ref = run(False)
    got = run(True)
    np.testing.assert_array_equal(ref, a + b + d if has_bias else a + b)
    np.testing.assert_array_equal(got, ref)


@needs_shim
def test_non_ndarray_in_numpy_launcher_falls_back(fresh_shim):
    """An object the shim does not take (not an ndarray) still launches, through ctypes."""
    fn = _sum_lib()
    n = 5

    class Host:
        def __init__(self, arr):
            self.arr = arr

    class Adapter:
        name = "numpy"

        @staticmethod
        def data_ptr(x):
            return None if x is None else (x.arr if isinstance(x, Host) else x).ctypes.data

    params = (ctypes.c_long * 2)(n, 1)
    launch = variant_base.pointer_launcher(fn, params, 1, tracea.PipelineConfig(), Adapter(), False, "test")
    a = np.arange(n, dtype=np.float32)
    out = np.zeros(n, np.float32)
    launch(Host(a), a, None, out)
    np.testing.assert_array_equal(out, 2 * a)


def test_fixed_picker_marks_its_count():
    assert thread_picker(1, 0).fixed == 1
    assert thread_picker(3, 3)() == 3


def _conv_ref(x, w, b, pad):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))  # n c p q r s
    return np.einsum("ncpqrs,kcrs->nkpq", win, w.astype(np.float64)) + b[None, :, None, None]


@needs_shim
@pytest.mark.parametrize("shape", [(16, 16, 16), (1, 37, 5), (33, 1, 70), (65, 129, 31)])
def test_ops_through_shim(fresh_shim, shape):
    m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    plans.invalidate("test")
    for _ in range(2):  # the first call builds the plans, the second runs them
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        got = tracea.ops.matmul(a, b, bias=bias, activation="relu")
        np.testing.assert_allclose(got, np.maximum(a.astype(np.float64) @ b + bias, 0), rtol=1e-4, atol=1e-4)
        x = rng.standard_normal((2, 3, 9, m % 7 + 3)).astype(np.float32)
        w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        cb = rng.standard_normal(4).astype(np.float32)
        np.testing.assert_allclose(tracea.ops.conv2d(x, w, cb, padding=1), _conv_ref(x, w, cb, 1), rtol=1e-4,
                                   atol=1e-4)
    assert launch_shim.status() == "in use"
