"""Shared fixtures of the tracea-torch tests.

``restricted_backend`` installs a real plugin ("testkit") whose variants serve only float32, NCHW,
groups=1, dilation=1 convolutions and float32 GEMMs on the CPU (computed with the NumPy reference
kernels on zero-copy views of the tensors), and forbids the reference backend for torch calls. The
Doctor then rejects the other cases with its real reasons, which is how production backends behave,
so every fallback path can be exercised without a compiled CPU backend.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tracea.doctor.variant import KernelVariant, OpArgs, Requirements  # noqa: E402
from tracea.dtypes import DType  # noqa: E402
from tracea.ir.ops import LayerType, Layout  # noqa: E402
from tracea.plugins import create_plugin_manager, hookimpl, set_plugin_manager  # noqa: E402
from tracea.plugins.backend_info import BackendInfo  # noqa: E402
from tracea.reference import kernels  # noqa: E402
from tracea.semantic.config import PipelineConfig  # noqa: E402

from tracea_torch import fallbacks, policy  # noqa: E402


class _CountingVariant(KernelVariant):
    backend = "testkit"
    priority = 0
    efficiency = 0.5

    def __init__(self) -> None:
        self.calls = 0

    def hero_configs(self, op, profile):  # noqa: ANN001
        return [PipelineConfig(tile_m=8, tile_n=8, tile_k=8, stages=1, warps=1)]


class _TestkitConv2d(_CountingVariant):
    name = "testkit.conv2d.nchw"
    description = "test-only NCHW f32 conv (NumPy)"
    requirements = Requirements("cpu", LayerType.CONV2D, dtypes=frozenset({DType.F32}), groups=False,
                                dilation=False, layouts=frozenset({Layout.NCHW}))

    def run(self, op, config, args: OpArgs, profile) -> None:  # noqa: ANN001
        self.calls += 1
        out = args.host("out")
        out[...] = kernels.conv2d(op, args.host("x"), args.host("w"), args.host("bias")).reshape(out.shape)


class _TestkitGemm(_CountingVariant):
    name = "testkit.gemm"
    description = "test-only f32 GEMM (NumPy)"
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}))

    def run(self, op, config, args: OpArgs, profile) -> None:  # noqa: ANN001
        self.calls += 1
        out = args.host("out")
        out[...] = kernels.gemm(op, args.host("a"), args.host("b"), args.host("bias")).reshape(out.shape)


class _TestkitPlugin:
    def __init__(self) -> None:
        self.conv = _TestkitConv2d()
        self.gemm = _TestkitGemm()

    @hookimpl
    def tracea_backend_info(self):  # noqa: ANN201
        return BackendInfo(name="testkit", version="0.1.0", package="tracea-torch-tests")

    @hookimpl
    def tracea_register_variants(self):  # noqa: ANN201
        return [self.conv, self.gemm]


@pytest.fixture(autouse=True)
def _clean_counters():
    fallbacks.reset()
    yield


@pytest.fixture(autouse=True)
def _arbiter_off_unless_asked(request, monkeypatch):
    """The arbiter (on by default for users) times each new layer signature against PyTorch and may route
    it to PyTorch: tests that check which kernel ran switch it off; tests marked ``arbiter`` keep it, with a
    tuning cache of their own."""
    if request.node.get_closest_marker("arbiter") is None:
        monkeypatch.setenv("TRACEA_ARBITER", "0")
    else:
        monkeypatch.setenv("TRACEA_ARBITER", "1")
        monkeypatch.setenv("TRACEA_CACHE_PATH", str(request.getfixturevalue("tmp_path") / "tuning_cache.json"))


@pytest.fixture
def restricted_backend(monkeypatch):
    """A Doctor with the testkit variants and no other backend; the reference oracle is not used for
    torch calls."""
    monkeypatch.delenv(policy.ENV_REFERENCE, raising=False)
    plugin = _TestkitPlugin()
    pm = create_plugin_manager(blocked=["cpu", "cuda", "opencl"])  # only testkit + reference serve
    pm.register_plugin(plugin, "testkit", "test")
    set_plugin_manager(pm)
    try:
        with policy.allow_reference(False):
            yield plugin
    finally:
        set_plugin_manager(None)


@pytest.fixture
def reference_backend():
    """Let the reference oracle serve torch calls (dispatch runs end to end on the CPU)."""
    set_plugin_manager(None)
    with policy.allow_reference(True):
        yield
    set_plugin_manager(None)


def _rel_err(out, ref) -> float:  # noqa: ANN001
    out64, ref64 = out.detach().double(), ref.detach().double()
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


@pytest.fixture
def rel_err():
    """``rel_err(out, ref)``: ||out - ref|| / ||ref|| in float64."""
    return _rel_err
