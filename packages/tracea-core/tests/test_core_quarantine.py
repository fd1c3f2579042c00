"""Failures do not stick: a variant that raises at run time is quarantined for that op and the next
candidate runs (warned once); a cached winner that fails is removed from the tuning cache."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tracea import ops
from tracea.doctor.variant import KernelVariant, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import LayerType
from tracea.plugins import create_plugin_manager, hookimpl, set_plugin_manager
from tracea.runtime import plans
from tracea.semantic.config import PipelineConfig
from tracea.tuning.cache import TuningCache, get_cache, set_cache


class _Broken(KernelVariant):
    name = "broken.gemm"
    backend = "broken"
    description = "raises at run time"
    priority = 10_000
    efficiency = 1e6  # the estimate ranks it first
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}))
    runs = 0

    def hero_configs(self, op, profile):  # noqa: ANN001
        return [PipelineConfig(warps=1)]

    def run(self, op, config, args, profile):  # noqa: ANN001
        type(self).runs += 1
        raise RuntimeError("kernel exploded")


class _Plugin:
    @hookimpl
    def tracea_register_variants(self):  # noqa: ANN201
        return [_Broken()]


@pytest.fixture
def broken(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    pm = create_plugin_manager()
    pm.register_plugin(_Plugin(), "broken", "test")
    set_plugin_manager(pm)
    _Broken.runs = 0
    from tracea.runtime import dispatch

    dispatch._warned.clear()  # warned once per process: each test sees its warning
    yield
    set_plugin_manager(None)
    set_cache(None)


def test_failing_variant_is_quarantined_and_the_next_candidate_runs(broken, rng):
    a = rng.standard_normal((9, 7), dtype=np.float32)
    b = rng.standard_normal((7, 5), dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="broken.gemm failed"):
        out = ops.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    out = ops.matmul(a, b)  # the plan of the next candidate: the broken variant is not tried again
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert _Broken.runs == 1
    from tracea.errors import BackendError

    with pytest.raises(BackendError, match="kernel exploded"):  # forcing it still runs it (and fails)
        ops.matmul(a, b, variant="broken.gemm")


def test_a_failing_cached_winner_is_removed_from_the_cache(broken, rng):
    a = rng.standard_normal((9, 7), dtype=np.float32)
    b = rng.standard_normal((7, 5), dtype=np.float32)
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import GemmOp

    d = get_doctor()
    op = GemmOp(9, 5, 7)
    v = d.registry.get("broken.gemm")
    cache = get_cache()
    cache.put(cache.make_entry(op, v, d.profile_for("cpu"), PipelineConfig(warps=1), {"median_s": 1e-12}))
    plans.invalidate("test")
    assert d.decide(op, "cpu").chosen.variant.name == "broken.gemm"
    with pytest.warns(RuntimeWarning):
        out = ops.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert not [e for e in get_cache().entries() if e.variant == "broken.gemm"]


@contextlib.contextmanager
def _serving(tmp_path, *variants):  # noqa: ANN001, ANN202
    """A fresh tuning cache and a plugin manager registering ``variants`` (the warnings re-armed) for the block."""
    set_cache(TuningCache(tmp_path / "cache.json"))
    pm = create_plugin_manager()

    class _Plugin:
        @hookimpl
        def tracea_register_variants(self):  # noqa: ANN201
            return list(variants)

    pm.register_plugin(_Plugin(), "serving", "test")
    set_plugin_manager(pm)
    from tracea.runtime import dispatch

    dispatch._warned.clear()
    try:
        yield
    finally:
        set_plugin_manager(None)
        set_cache(None)


class _LaterBroken(_Broken):
    """Binds a pointer-only launcher (the plan's one-frame hot path) that computes its first call and raises on
    later ones: the failure happens inside a stored plan, not on the first call."""

    name = "laterbroken.gemm"

    def bind(self, op, config, profile, adapter):  # noqa: ANN001, ANN201
        def launch(a, b, bias, out):  # noqa: ANN001, ANN202
            type(self).runs += 1
            if type(self).runs > 1:
                raise RuntimeError("kernel exploded later")
            np.matmul(a, b, out=out)

        launch.pointer_only = True
        return launch


def test_a_stored_plan_whose_launch_fails_quarantines_and_reruns(tmp_path, rng):
    """The lean plan calls the bound launch without the guard's frame; its failure still quarantines the variant
    (warned), this call is decided again and served by the next candidate, and later calls use that one."""
    _LaterBroken.runs = 0
    with _serving(tmp_path, _LaterBroken()):
        a = rng.standard_normal((9, 7), dtype=np.float32)
        b = rng.standard_normal((7, 5), dtype=np.float32)
        ref = a.astype(np.float64) @ b
        np.testing.assert_allclose(ops.matmul(a, b), ref, rtol=1e-5, atol=1e-5)  # served by the bound launch
        assert _LaterBroken.runs == 1
        with pytest.warns(RuntimeWarning, match="laterbroken.gemm failed"):
            out = ops.matmul(a, b)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ops.matmul(a, b), ref, rtol=1e-5, atol=1e-5)
        assert _LaterBroken.runs == 2  # quarantined: not tried again


class _BrokenAttention(KernelVariant):
    """An attention variant whose bound launch always fails (as a CUDA one refusing misaligned views does)."""

    name = "broken.attention"
    backend = "broken"
    description = "raises at run time"
    priority = 10_000
    efficiency = 1e6
    requirements = Requirements("cpu", LayerType.ATTENTION, dtypes=frozenset({DType.F32}))

    def hero_configs(self, op, profile):  # noqa: ANN001
        return [PipelineConfig(warps=1)]

    def takes_strides(self, op):  # noqa: ANN001
        return True

    def bind(self, op, config, profile, adapter):  # noqa: ANN001, ANN201
        def launch(*arrays):  # noqa: ANN002, ANN202
            from tracea.errors import LaunchError

            raise LaunchError("broken.attention: q, k, v and out must be 16-byte aligned", backend="cpu")

        launch.pointer_only = True
        return launch


def test_attention_whose_first_launch_fails_runs_the_next_candidate(tmp_path, rng):
    """GPU fuzz finding (seed 4343, cases 7314 / 9767): the first call of an attention signature whose chosen
    variant failed at run time raised the internal Quarantined signal to the user (``plan_attention.attention``
    had lost its retry wrapper). Now the call is decided again and served by the next candidate."""
    with _serving(tmp_path, _BrokenAttention()):
        q = rng.standard_normal((2, 5, 4, 16), dtype=np.float32).transpose(0, 2, 1, 3)  # strided (BSHD memory)
        k = rng.standard_normal((2, 4, 7, 16), dtype=np.float32)
        v = rng.standard_normal((2, 4, 7, 16), dtype=np.float32)
        s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) / 4.0
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)
        with pytest.warns(RuntimeWarning, match="broken.attention failed"):
            out = ops.attention(q, k, v)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ops.attention(q, k, v), ref, rtol=1e-4, atol=1e-5)
