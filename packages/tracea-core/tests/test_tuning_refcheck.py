"""The tuner's sampled reference check: same verdicts as the full check, at a fraction of the cost."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.doctor import get_doctor
from tracea.ir.device import Device
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea.tuning.inputs import random_host_inputs, reference_output
from tracea.tuning.refcheck import ReferenceCheck, as_check, reference_check, sample_plan


def _runner():
    doctor = get_doctor()
    cpu = doctor.profile_for(Device.cpu())

    def run(op, host):
        ref = next(v for v in doctor.variants() if getattr(v, "oracle", False) and not v.check(op, cpu))
        return reference_output(op, host, ref, cpu)

    return run


OPS = [GemmOp(96, 40, 56, epilogue="bias+gelu"), GemmOp(70, 33, 20, batch=3, trans_a=True, trans_b=True),
       Conv2dOp(5, 6, 9, 7, 8, 3, 3, padding=1, layout="nhwc", epilogue="bias+relu"),
       Conv2dOp(4, 3, 8, 8, 5, 3, 3, stride=2, layout="nchw"),
       AttentionOp(3, 2, 17, 17, 8, causal=True)]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.describe())
def test_sample_matches_full_reference(op):
    run = _runner()
    host = random_host_inputs(op, np.random.default_rng(1))
    full = run(op, host)
    check = reference_check(op, host, run, seed=3, budget_flops=op.flops / 4)
    assert check.sampled < 1.0
    assert np.allclose(check.take(full), check.expected, rtol=1e-6, atol=1e-6)
    assert check.error(full) < 1e-6


def test_sampled_check_catches_wrong_and_unwritten_outputs():
    op = GemmOp(256, 32, 64)
    run = _runner()
    host = random_host_inputs(op, np.random.default_rng(0))
    full = run(op, host)
    check = reference_check(op, host, run, budget_flops=op.flops / 16)
    bad = full.copy()
    bad[-1, :] += 1.0          # the last row (an edge tile) is always in the sample
    assert check.error(bad) > 1e-3
    hole = full.copy()
    hole[100, 5] = np.nan      # unwritten (poisoned) element outside the sample
    assert check.error(hole) == float("inf")


def test_small_ops_are_checked_whole():
    op = GemmOp(8, 8, 8)
    assert sample_plan(op, {}, np.random.default_rng(0)) is None
    arr = np.ones((8, 8))
    assert as_check(arr).sampled == 1.0 and as_check(None) is None
    assert isinstance(as_check(ReferenceCheck.full(arr)), ReferenceCheck)


def test_big_gemm_sample_is_cheap():
    op = GemmOp(8192, 8192, 8192)
    host = {"a": np.zeros((8192, 16), np.float32), "b": None, "bias": None}  # shapes only matter for rows
    plan = sample_plan(op, {**host, "b": np.zeros((1, 1), np.float32)}, np.random.default_rng(0))
    sub_op = plan[0]
    assert sub_op.flops <= 2.1e9 and sub_op.m >= 2
