"""Seed API surface: Context, Graph, GPUInfo, ProblemDescriptor, SearchSpace, torch re-exports."""

from __future__ import annotations

import numpy as np
import pytest

import tracea
from tracea.errors import ShapeError, UnsupportedDeviceError


def test_context_matmul_seed_api(rng):
    ctx = tracea.Context()
    assert ctx.device == tracea.get_doctor().best_device()
    cpu = tracea.Context("cpu")
    a = rng.standard_normal((16, 8), dtype=np.float32)
    b = rng.standard_normal((8, 12), dtype=np.float32)
    c = np.full((16, 12), np.nan, np.float32)
    res = cpu.matmul(a, b, c, 16, 12, 8, tracea.Epilogue.empty())
    cpu.synchronize()
    assert res is c and np.allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="m=16, n=12, k=9"):
        cpu.matmul(a, b, c, 16, 12, 9)
    assert "chosen" in cpu.explain(tracea.GemmOp(16, 12, 8))


def test_context_by_name():
    name = tracea.get_doctor().profile_for("cpu").name
    assert tracea.Context(name).device.kind == "cpu"
    with pytest.raises(UnsupportedDeviceError, match="GeForce RTX 3070"):
        tracea.Context("GeForce RTX 3070")


def test_graph_builder():
    g = tracea.Graph()
    g.add_gemm(4096, 4096, 4096)
    g.add_gemm(1024, 1024, 1024, dtype="f16")
    g.add_gemm(4096, 4096, 4096)
    g.add_conv2d(8, 64, 56, 56, 64, 3, padding=1)
    g.add_attention(1, 8, 128, head_dim=64, causal=True)
    assert len(g) == 5 and len(g.unique()) == 4 and g.unique()[tracea.GemmOp(4096, 4096, 4096)] == 2
    assert tracea.Graph.from_dict(g.to_dict()).nodes == g.nodes


def test_gpuinfo_presets_and_detect():
    presets = tracea.GPUInfo.presets()
    assert {"rtx3070", "a100", "h100", "h200"} <= set(presets)
    h100 = tracea.GPUInfo.h100().to_profile()
    assert h100.compute_capability == (9, 0) and h100.has("wgmma") and h100.shared_mem_per_block > 200 * 1024
    assert tracea.GPUInfo.from_profile(h100).sm_count == 132
    assert tracea.GPUInfo.rtx3070().arch == "sm_86"
    detected = tracea.GPUInfo.detect()
    assert detected is None or detected.sm_count > 0


def test_seed_enums():
    assert tracea.OptimizationGoal.MaximizeTFLOPS is tracea.OptimizationGoal.MAXIMIZE_TFLOPS
    assert {g.name for g in tracea.OptimizationGoal} == {"MaximizeTFLOPS", "MinimizeLatency", "Balanced"}
    assert tracea.SwizzleMode.Xor4 is tracea.SwizzleMode.XOR4
    assert tracea.BarrierMode.ProducerConsumer is tracea.BarrierMode.PRODUCER_CONSUMER
    assert tracea.LayerType.Gemm is tracea.LayerType.GEMM
