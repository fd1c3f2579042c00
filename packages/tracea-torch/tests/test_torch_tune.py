"""tracea_torch.tune: shape collection, graph building, per-layer report (tuning needs the tuner's
graph tuning, ``tracea.tuning.graph``)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

import tracea
import tracea_torch

pytestmark = pytest.mark.torch

HAS_GRAPH_TUNER = importlib.util.find_spec("tracea.tuning.graph") is not None


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.Flatten(), nn.Linear(8 * 6 * 6, 10), nn.GELU(),
                         nn.Linear(10, 4)).eval()


def test_collect_names_every_layer_and_its_op(restricted_backend):
    model = _model()
    calls = tracea_torch.tuning.collect(model, torch.randn(2, 3, 6, 6))
    assert [c.layer for c in calls] == ["0", "2", "3", "5", "7"]
    assert [c.kind for c in calls] == ["conv2d", "conv2d", "conv2d", "linear", "linear"]
    conv0 = calls[0].op
    assert isinstance(conv0, tracea.Conv2dOp) and (conv0.n, conv0.c, conv0.k, conv0.h) == (2, 3, 8, 6)
    assert conv0.epilogue.key == "bias+relu"  # the ReLU after it is fused while tuning
    assert calls[2].fallback and "groups=2" in calls[2].fallback
    assert calls[3].op.epilogue.key == "bias+gelu_erf" and calls[3].op.m == 2
    # the model is left as it was
    assert type(model[0]) is nn.Conv2d and type(model[1]) is nn.ReLU


def test_report_without_tuning(restricted_backend):
    report = tracea_torch.tune(_model(), torch.randn(2, 3, 6, 6), graph_tuning=False, repeats=2, warmup=1)
    assert len(report.layers) == 5 and len(report.graph) == 4  # grouped conv falls back, not tuned
    fb = [r for r in report.layers if r.fallback]
    assert len(fb) == 1 and fb[0].speedup is None and fb[0].tracea_s is None
    served = [r for r in report.layers if not r.fallback]
    assert all(r.variant and r.variant.startswith("testkit.") and r.tracea_s > 0 and r.speedup > 0 for r in served)
    text = str(report)
    assert "speedup" in text and "fallback: " in text and "total" in text
    assert report.to_dict()["layers"][0]["layer"] == "0"


def test_report_filter_patches_only_the_faster_layers(restricted_backend):
    model = _model()
    report = tracea_torch.tune(model, torch.randn(2, 3, 6, 6), graph_tuning=False, repeats=2, warmup=1)
    speedups = {"0": 2.0, "2": 0.5, "5": 1.0, "7": 0.99}  # pinned: measured ones would make this flaky
    for r in report.layers:
        if r.layer in speedups:
            r.torch_s = speedups[r.layer] * r.tracea_s
    keep = report.faster()
    assert [name for name in ("0", "2", "3", "5", "7") if keep(name, model[int(name)])] == ["0", "5"]
    assert [name for name in ("0", "5") if report.faster(margin=1.5)(name, model[int(name)])] == ["0"]
    tracea_torch.patch_conv2d(model, filter=keep)
    try:  # "3" (groups=2) falls back to PyTorch: never kept
        assert type(model[0]) is not nn.Conv2d and type(model[2]) is nn.Conv2d and type(model[3]) is nn.Conv2d
    finally:
        tracea_torch.unpatch_conv2d(model)
    assert type(model[0]) is nn.Conv2d


@pytest.mark.skipif(not HAS_GRAPH_TUNER, reason="tracea.tuning.graph (the tuner's graph tuning) is not installed")
def test_tune_tunes_the_graph_and_dispatch_uses_it(reference_backend, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEA_CACHE_PATH", str(tmp_path / "tuning_cache.json"))
    model = _model()
    x = torch.randn(1, 3, 6, 6)
    ref = model(x)
    report = tracea_torch.tune(model, x, iterations=4, repeats=2, warmup=1, progress=False)
    assert report.tuning is not None and len(report.graph) == 5  # the reference serves the grouped conv too
    assert (tmp_path / "tuning_cache.json").exists()
    assert all(r.config_source == "cache" for r in report.layers), [r.config_source for r in report.layers]
    with tracea_torch.patched(model):
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-4)
