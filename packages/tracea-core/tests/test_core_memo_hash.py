"""Ops and configs remember their hash (they key dispatch-time memos) without changing what equality,
pickling or copying see."""

from __future__ import annotations

import copy
import pickle

from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea.semantic.config import PipelineConfig


def _objects():
    return [GemmOp(64, 48, 32, dtype_a="float16", dtype_b="float16", epilogue="bias+gelu"),
            Conv2dOp(1, 16, 8, 8, 32, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias+relu"),
            AttentionOp(2, 4, 64, 64, 32, causal=True),
            PipelineConfig(128, 256, 64, 3, 12, params=(("defer", True), ("group_m", 16)))]


def test_hash_is_remembered_and_equal_objects_hash_alike():
    for a, b in zip(_objects(), _objects()):
        assert a == b and a is not b
        assert hash(a) == hash(b) == hash(a)
        assert {a: 1}[b] == 1


def test_pickle_and_copy_drop_the_remembered_hash():
    for obj in _objects():
        h = hash(obj)
        for clone in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
            assert clone == obj
            assert "_memo_hash" not in clone.__dict__
            assert hash(clone) == h  # recomputed, equal within this process
