"""Helpers for testing kernels against the reference (used by every package's tests).

- :func:`random_inputs` draws fresh random operands for an op (never zeros);
- :func:`check_against_reference` runs an op through :mod:`tracea.ops` (optionally pinned to a variant)
  on poisoned outputs and compares with the float64 reference by ``||out - ref|| / ||ref||``;
- :func:`tolerance` is the accepted relative error for a dtype / fp32 precision (PERFORMANCE.md's method);
- :func:`inject_nonfinite` and :func:`nonfinite_mismatch` test NaN / Inf propagation (docs/architecture.md,
  "Numerics"): NaN, +Inf and -Inf must sit exactly where the float64 reference (or PyTorch) has them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..dtypes import DType, Fp32Precision
from ..ir.epilogue import Epilogue, EpilogueKind
from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, Op
from ..reference import reference


def tolerance(dtype: DType, precision: Fp32Precision = Fp32Precision.HIGHEST) -> float:
    """Accepted relative error: fp64 1e-12, fp32 1e-5 (TF32/bf16 math 5e-3), fp16 5e-3, bf16 2e-2."""
    dtype = dtype.storage
    if dtype is DType.F64:
        return 1e-12
    if dtype is DType.F32:
        return 1e-5 if precision is Fp32Precision.HIGHEST else 5e-3
    if dtype is DType.F16:
        return 5e-3
    return 2e-2


def rel_err(out: Any, ref: np.ndarray) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere (or a size mismatch) gives ``inf``. The same
    measure the tuner applies (:func:`tracea.tuning.inputs.relative_error`)."""
    from ..tuning.inputs import relative_error

    return relative_error(out, ref)


def output_error(op: Op, out: Any, inputs: dict[str, Any]) -> float:
    """:func:`rel_err` of ``out`` against the float64 reference of ``op`` on ``inputs``, with two guards
    against outputs that are small only by cancellation (any fp32 code loses digits there, the reference
    libraries' included):

    - with activations in the epilogue the error is also measured against the activation's input scale
      (GELU near x = -3 loses ~2e-5 relative), which a tiny output would otherwise report as the whole error;
    - for GEMM and convolution the error is also measured against ``||ref(|a|, |b|, |bias|)|| / sqrt(k)``,
      the scale the summed terms had (about ``||ref||`` on random data): a 1 x 1 x 1 product plus bias that
      cancels to 1e-6 has an fp32 rounding error of ~1e-8 of its terms, not of its value."""
    o = np.asarray(out, dtype=np.float64)
    ref = reference(op, **inputs).reshape(o.shape)
    err = rel_err(o, ref)
    if not 0 < err < float("inf"):
        return err
    scale = float(np.linalg.norm(ref))
    bias_only = dataclasses.replace(op, epilogue=Epilogue(tuple(  # type: ignore[type-var]
        s for s in op.epilogue if s is EpilogueKind.BIAS))) if isinstance(op, (GemmOp, Conv2dOp)) else op
    if any(step is not EpilogueKind.BIAS for step in getattr(op, "epilogue", ())):
        scale = max(scale, float(np.linalg.norm(reference(bias_only, **inputs))))
    if isinstance(op, (GemmOp, Conv2dOp)):
        terms = op.k if isinstance(op, GemmOp) else (op.c // op.groups) * op.r * op.s
        mags = {name: np.abs(np.asarray(v, dtype=np.float64)) for name, v in inputs.items()
                if name in ("a", "b", "x", "w", "bias") and v is not None}
        scale = max(scale, float(np.linalg.norm(reference(bias_only, **mags))) / np.sqrt(terms))
    return float(np.linalg.norm(o - ref) / max(scale, 1e-300))


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType | str = "float32",
                 scale: float = 1.0) -> np.ndarray:
    """Standard-normal values times ``scale`` in ``dtype`` (a NumPy-storable dtype)."""
    dt = DType.parse(dtype).numpy
    assert dt is not None, f"{dtype} has no NumPy storage"
    return (rng.standard_normal(shape) * scale).astype(dt)


def random_inputs(op: Op, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh random host operands for ``op``, by role, in the physical layouts kernels receive."""
    if isinstance(op, GemmOp):
        a_shape = (op.k, op.m) if op.trans_a else (op.m, op.k)
        b_shape = (op.n, op.k) if op.trans_b else (op.k, op.n)
        if op.batch > 1:
            a_shape, b_shape = (op.batch,) + a_shape, (op.batch,) + b_shape  # type: ignore[assignment]
        out = {"a": random_array(rng, a_shape, op.dtype_a, 1 / np.sqrt(op.k) ** 0.5),
               "b": random_array(rng, b_shape, op.dtype_b, 1 / np.sqrt(op.k) ** 0.5)}
        if op.epilogue.has_bias:
            out["bias"] = random_array(rng, (op.n,), op.out_dtype)
        return out
    if isinstance(op, Conv2dOp):
        fan_in = (op.c // op.groups) * op.r * op.s
        out = {"x": random_array(rng, op.x_shape, op.dtype),
               "w": random_array(rng, op.w_shape, op.dtype, 1 / np.sqrt(fan_in))}
        if op.epilogue.has_bias:
            out["bias"] = random_array(rng, (op.k,), op.out_dtype)
        return out
    if isinstance(op, AttentionOp):
        kvh = int(op.kv_heads or op.heads)
        return {"q": random_array(rng, (op.batch, op.heads, op.seq_q, op.head_dim), op.dtype),
                "k": random_array(rng, (op.batch, kvh, op.seq_kv, op.head_dim), op.dtype),
                "v": random_array(rng, (op.batch, kvh, op.seq_kv, op.head_dim), op.dtype)}
    raise TypeError(f"unknown op {op!r}")


def run_variant_on_host(variant: Any, op: Op, inputs: dict[str, np.ndarray], config: Any = None,
                        profile: Any = None) -> np.ndarray:
    """Run one variant directly (no dispatch) on host inputs with a NaN-poisoned output; returns it."""
    from ..doctor.doctor import get_doctor
    from ..doctor.variant import OpArgs
    from ..runtime.arrays import NumpyAdapter
    from ..runtime.dispatch import prepare_and_run

    doctor = get_doctor()
    profile = profile or doctor.profile_for("cpu")
    if config is None:
        found = doctor.default_config(variant, op, profile)
        assert not isinstance(found, str), found
        config = found[0]
    out_np = op.out_dtype.numpy
    assert out_np is not None
    out = np.full(_out_shape(op), np.nan, dtype=out_np)
    prepare_and_run(variant, op, config, OpArgs(inputs, out, NumpyAdapter()), profile, doctor)
    return out


def _out_shape(op: Op) -> tuple[int, ...]:
    if isinstance(op, GemmOp):
        return (op.batch, op.m, op.n) if op.batch > 1 else (op.m, op.n)
    if isinstance(op, Conv2dOp):
        return op.out_shape
    assert isinstance(op, AttentionOp)
    return (op.batch, op.heads, op.seq_q, op.head_dim)


def check_variant(variant: Any, op: Op, rng: np.random.Generator, config: Any = None, tol: float | None = None) -> float:
    """Run ``variant`` on fresh random inputs and assert it matches the reference; returns the error."""
    inputs = random_inputs(op, rng)
    out = run_variant_on_host(variant, op, inputs, config)
    err = output_error(op, out, inputs)
    limit = tol if tol is not None else tolerance(op.dtypes[0], getattr(op, "fp32_precision", Fp32Precision.HIGHEST))
    assert err <= limit, f"{getattr(variant, 'name', variant)} on {op.describe()} config {config}: rel err {err:.3e} > {limit:.1e}"
    return err


NONFINITE = (float("nan"), float("inf"), float("-inf"))


def inject_nonfinite(rng: np.random.Generator, arr: Any, count: int = 1,
                     values: tuple[float, ...] = NONFINITE) -> list[tuple[tuple[int, ...], float]]:
    """Write ``count`` values drawn from ``values`` (default NaN, +Inf, -Inf) at random positions of
    ``arr`` in place (a NumPy array or a torch tensor); returns ``[(index, value), ...]`` (for messages)."""
    done = []
    for _ in range(count):
        idx = tuple(int(rng.integers(0, n)) for n in arr.shape)
        val = float(values[int(rng.integers(0, len(values)))])
        arr[idx] = val
        done.append((idx, val))
    return done


def nonfinite_mismatch(out: Any, ref: Any, atol: float = 1e-4) -> str | None:
    """None when ``out`` has NaN, +Inf and -Inf exactly where ``ref`` has them and every finite value
    agrees to ``atol * max(1, |ref|)`` (relative, absolute below 1); otherwise a description of where
    they differ."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64).reshape(o.shape)
    for name, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        diff = np.argwhere(test(o) != test(r))
        if diff.size:
            where = [tuple(int(i) for i in d) for d in diff[:4]]
            return (f"{name} differs at {len(diff)} of {o.size} positions, e.g. "
                    + ", ".join(f"{w}: got {o[w]!r}, expected {r[w]!r}" for w in where))
    finite = np.isfinite(r)
    if finite.any():
        err = np.abs(o[finite] - r[finite]) / np.maximum(1.0, np.abs(r[finite]))
        worst = int(np.argmax(err))
        if err[worst] > atol:
            at = tuple(int(i) for i in np.argwhere(finite)[worst])
            return f"finite values differ by {err[worst]:.3e} (> {atol:.1e}) at {at}: got {o[at]!r}, expected {r[at]!r}"
    return None
