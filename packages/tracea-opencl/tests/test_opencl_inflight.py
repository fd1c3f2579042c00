"""Temporaries of an OpenCL launch (the packed B, the source of an output copy) stay referenced until
the command using them has completed: :mod:`tracea_opencl.inflight`, with stand-in events (no OpenCL
needed), and on a real queue where a platform exists."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from tracea_opencl import inflight


class _Event:
    def __init__(self) -> None:
        self.command_execution_status = 1  # CL_SUBMITTED
        self.waited = False

    def wait(self) -> None:
        self.waited = True
        self.command_execution_status = 0


class _Obj:
    pass


def test_objects_live_until_their_event_completes():
    ev, obj = _Event(), _Obj()
    ref = weakref.ref(obj)
    inflight.hold(ev, obj)
    del obj
    gc.collect()
    assert ref() is not None  # the command is still pending
    ev.command_execution_status = 0  # CL_COMPLETE
    inflight.hold(_Event())  # any later call drops completed entries
    gc.collect()
    assert ref() is None


def test_pending_commands_are_bounded(monkeypatch):
    monkeypatch.setattr(inflight, "MAX_PENDING", 4)
    monkeypatch.setattr(inflight, "_pending", [])
    events = [_Event() for _ in range(6)]
    for ev in events:
        inflight.hold(ev, _Obj())
    assert events[0].waited and events[1].waited and not events[2].waited
    assert inflight.pending() == 4


@pytest.mark.opencl
def test_packed_b_is_held_by_the_launch(cl_profile, oracle, monkeypatch):
    from tracea.doctor.variant import OpArgs
    from tracea.ir.ops import GemmOp
    from tracea.semantic.config import PipelineConfig
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.gemm import OpenCLGemm

    op = GemmOp(64, 96, 80)
    cfg = PipelineConfig(tile_m=8, tile_n=32, tile_k=8, stages=1, warps=1,
                         params={"wg_m": 1, "wg_n": 16, "vw": 1, "local": 0, "raster": 4096, "pack": 1})
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 64, 80)).astype(np.float32), rng.standard_normal((1, 80, 96)).astype(np.float32)
    dev = cl_profile.device
    out = to_device(np.full((1, 64, 96), np.nan, np.float32), dev)
    calls = []
    real = inflight.hold
    monkeypatch.setattr(inflight, "hold", lambda ev, *objs: (calls.append((ev, objs)), real(ev, *objs)))
    events = OpenCLGemm().launch(op, cfg, OpArgs({"a": to_device(a, dev), "b": to_device(b, dev), "bias": None}, out,
                                                 PyOpenCLAdapter()), cl_profile)
    assert len(events) == 2, "expected a pack command before the GEMM"
    (ev, objs), = calls
    assert ev is events[-1] and objs[0].size == 96 * 80  # the packed B (96 columns in 32-wide panels)
    assert oracle.rel_error(out.get(), oracle.gemm(op, a, b, None)) < 1e-5
