"""``tracea_torch.tune``: tune every convolution and linear layer of a model as one graph, then report
per-layer speedups against PyTorch.

1. The model runs once on ``example_inputs`` (no grad) with its layers routed through Tracea (a model
   that is not patched yet is patched for the duration of the call, as :func:`patch_conv2d` /
   :func:`patch_linear` would), recording the op each layer dispatches.
2. The distinct ops a Tracea variant serves form a :class:`tracea.Graph`, tuned with one budget by
   ``tracea.Context(device).optimize_graph`` (the tuner's graph tuning: time-weighted budget, identical
   shapes tuned once, results in the persistent tuning cache that dispatch then reads).
3. Each layer is timed through Tracea and through PyTorch (``F.conv2d`` / ``F.linear`` plus the same
   activation) on the recorded tensors; the :class:`TuneReport` prints as a table.

Layers that fall back to PyTorch are listed with the reason and not tuned.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from tracea.ir.epilogue import Epilogue

from . import bridge, eager, recording
from .adapter import device_of
from .patching import is_patched, patched


@dataclass
class LayerResult:
    """One layer's op, the variant that serves it and the measured times (seconds, medians)."""

    layer: str
    kind: str
    op: str
    variant: str | None
    config_source: str | None
    tracea_s: float | None
    torch_s: float
    fallback: str | None = None

    @property
    def speedup(self) -> float | None:
        """PyTorch time / Tracea time (> 1: Tracea is faster); None for a fallback layer."""
        return None if not self.tracea_s else self.torch_s / self.tracea_s


@dataclass
class TuneReport:
    """What :func:`tune` did: the per-layer table, the tuned graph and the graph tuner's result."""

    layers: list[LayerResult]
    graph: Any
    tuning: Any = None
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def total(self) -> tuple[float, float]:
        """Summed (Tracea-or-fallback, PyTorch) layer times in seconds."""
        tr = sum(r.tracea_s if r.tracea_s is not None else r.torch_s for r in self.layers)
        return tr, sum(r.torch_s for r in self.layers)

    def faster(self, margin: float = 1.0) -> Callable[[str, nn.Module], bool]:
        """A patch filter keeping the layers Tracea ran at least ``margin`` times as fast as PyTorch:
        ``patch_conv2d(model, filter=report.faster())`` leaves every slower layer (and every fallback)
        to PyTorch, so the patched model is not slower than eager layer by layer. Layers are matched by
        their qualified names in the tuned model."""
        keep = frozenset(r.layer for r in self.layers if r.speedup is not None and r.speedup >= margin)
        return lambda name, module: name in keep

    def table(self) -> str:
        """The per-layer comparison as a fixed-width text table."""
        head = ["layer", "op", "variant", "tracea ms", "torch ms", "speedup"]
        rows = []
        for r in self.layers:
            rows.append([r.layer, r.op, r.variant or f"fallback: {r.fallback}",
                         f"{r.tracea_s * 1e3:.3f}" if r.tracea_s is not None else "-",
                         f"{r.torch_s * 1e3:.3f}", f"{r.speedup:.2f}x" if r.speedup is not None else "-"])
        tr, pt = self.total()
        rows.append(["total", "", "", f"{tr * 1e3:.3f}", f"{pt * 1e3:.3f}", f"{pt / tr:.2f}x" if tr else "-"])
        from tracea.cli.table import aligned

        lines = [f"Tracea vs PyTorch per layer on {self.device} (median times)"]
        lines += aligned([head, *rows], right=(3, 4, 5), rules=(1,))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "notes": list(self.notes),
                "layers": [{**r.__dict__, "speedup": r.speedup} for r in self.layers]}


# ------------------------------------------------------------------------------------------------
# collection
# ------------------------------------------------------------------------------------------------

def collect(model: nn.Module, example_inputs: Any) -> list[recording.Call]:
    """Run ``model`` once and return every conv2d/linear call it dispatched, named by layer."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    names = {m: n or type(model).__name__ for n, m in model.named_modules()}
    handles = []

    def pre(mod: nn.Module, _args: Any) -> None:
        recording.layers.append(names.get(mod, type(mod).__name__))

    def post(mod: nn.Module, _args: Any, _out: Any) -> None:
        recording.layers.pop()

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
    try:
        needs_patch = not (is_patched("conv2d") and is_patched("linear"))
        ctx = patched(model) if needs_patch else contextlib.nullcontext()
        with torch.no_grad(), ctx, recording.recording() as calls:
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
        recording.layers.clear()
    return calls


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------

def _median_seconds(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _torch_call(call: recording.Call) -> Callable[[], Any]:
    if call.kind == "conv2d":
        x, w, b, stride, padding, dilation, groups, act = call.args
        act_n = bridge.parse_activation(act)

        def run_conv() -> Any:
            y = F.conv2d(x, w, b, stride, padding, dilation, groups)
            return eager.apply_epilogue(y, Epilogue.of(act_n), None, 1) if act_n else y
        return run_conv
    x, w, b, act = call.args
    act_n = bridge.parse_activation(act)

    def run_linear() -> Any:
        y = F.linear(x, w, b)
        return eager.apply_epilogue(y, Epilogue.of(act_n), None, -1) if act_n else y
    return run_linear


def _tracea_call(call: recording.Call) -> Callable[[], Any]:
    fn = bridge.conv2d if call.kind == "conv2d" else bridge.linear
    return lambda: fn(*call.args)


# ------------------------------------------------------------------------------------------------
# tune
# ------------------------------------------------------------------------------------------------

def tune(model: nn.Module, example_inputs: Any, *, iterations: int = 15, goal: Any = None,
         warmup: int = 2, repeats: int = 10, graph_tuning: bool = True, **tuner_kwargs: Any) -> TuneReport:
    """Tune every conv2d/linear op ``model`` dispatches on ``example_inputs`` as one graph and
    measure each layer against PyTorch.

    :param model: the model (patched or not; see the module docstring).
    :param example_inputs: a tensor or a tuple of positional inputs, on the device to tune for.
    :param iterations: total trial budget for the graph, spread over its distinct ops by their share of
        the estimated time (identical shapes are tuned once).
    :param goal: a :class:`tracea.OptimizationGoal` (default: MaximizeTFLOPS).
    :param warmup: untimed runs before timing each layer. ``repeats``: timed runs (the median counts).
    :param graph_tuning: False skips tuning (only measure the current choices).
    :param tuner_kwargs: passed to ``optimize_graph`` (for example a ``progress`` flag).
    :returns: a :class:`TuneReport`; ``print(report)`` shows the table.
    """
    from tracea import Context, Graph, OptimizationGoal
    from tracea.doctor.doctor import get_doctor

    calls = collect(model, example_inputs)
    device = next((c.args[0].device for c in calls), torch.device("cpu"))
    graph = Graph(name=type(model).__name__)
    seen = set()
    for c in calls:
        if c.fallback is None and c.op is not None and c.op not in seen:
            seen.add(c.op)
            graph.add(c.op)
    notes: list[str] = []
    result = None
    if graph_tuning and len(graph):
        ctx = Context(device_of(device))
        result = ctx.optimize_graph(graph, iterations=iterations, goal=goal or OptimizationGoal.MaximizeTFLOPS,
                                    **tuner_kwargs)
        get_doctor().invalidate()
    elif not len(graph):
        notes.append("no layer is served by a Tracea variant here: nothing to tune (see the fallback reasons)")
    layers = []
    with torch.no_grad():
        for c in calls:
            torch_s = _median_seconds(_torch_call(c), device, warmup, repeats)
            variant = source = None
            tracea_s = None
            served = bridge.serving_variant(c.op, device) if c.fallback is None and c.op is not None else None
            if served is not None:
                variant, source = served
                tracea_s = _median_seconds(_tracea_call(c), device, warmup, repeats)
            layers.append(LayerResult(c.layer or "?", c.kind, c.op.describe() if c.op is not None else c.kind,
                                      variant, source, tracea_s, torch_s, c.fallback))
    return TuneReport(layers, graph, result, str(device), notes)
