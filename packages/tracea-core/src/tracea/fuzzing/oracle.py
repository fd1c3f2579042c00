"""The oracle: judge one executed case.

A call passes when it either raised a :class:`~tracea.errors.TraceaError` (allowed unless the case is
``valid``) or returned the right result: the right array kind, device, dtype and shape, ``out`` itself
when ``out=`` was given, no memory shared with an input, and values within :func:`bound` of the
float64 reference. Wherever the reference is NaN or +-Inf (after rounding to the output dtype) the
result must be the same NaN / Inf, or the activation's limit (see :mod:`.reference`). Independently of
the outcome, no input byte may change, and no byte of ``out``'s buffer outside its elements.

Error bounds (per element, ``u(t)`` the unit roundoff of dtype ``t``: f64 2^-53, f32 2^-24, f16 2^-11,
bf16 2^-8; ``mag`` the op on absolute values, see :mod:`.reference`):

* GEMM / conv2d with reduction length ``K`` (conv: C/groups * R * S):
  ``2 * mag * (K * u_acc + u_prec + (2 + steps) * u(out) + steps * a) + 2 * tiny(out)`` where ``u_acc``
  is u(f64) for float64 inputs and u(f32) otherwise (kernels accumulate in fp32 at least),
  ``u_prec`` is 2 * u(tf32 = 2^-11) for ``fp32_precision="high"``, 2 * u(bf16) for ``"medium"`` and
  2^-21 for ``"highest"`` (fp32-accurate 3xTF32 Tensor Core GEMMs on CUDA)
  (float32 inputs only), ``steps`` the epilogue steps (each may round to the output dtype) and ``a``
  = 1e-6 the error of the kernels' vectorised exp/tanh/erf (1e-12 for float64 inputs). ``K * u`` is
  Higham's deterministic bound; for float32 at K = 4096 it is 2.4e-4 of ``mag``.
* alternatives that differ only where values are not finite are accepted too (see :mod:`.reference`:
  activation limits, conv padding taps skipped, IEEE softmax, float32 softmax weights, keys the causal
  mask hides skipped even where their values are NaN / Inf); for calls PyTorch computed (the
  framework fallback) positions where the reference is NaN / Inf are not judged, nor, when an input
  holds NaN / Inf, positions where the result is: PyTorch's CPU kernels disagree among themselves
  there (float16 vs float64 SDPA, oneDNN's channels_last conv skipping padding taps, its bf16 conv
  spreading a NaN input beyond its receptive field), so that is PyTorch's behaviour, not Tracea's;
* attention with head_dim ``d`` over ``S`` keys: the logits' error ``e = L * (d * u_acc + u_low)``
  (``L`` = |scale| * max_j |q_i||k_j| per query row; ``u_low`` = u(input) for f16/bf16, which may
  round logits) moves each probability by at most ``2e`` relative, so
  ``2 * mag * (2e + S * u_acc + 4e-6 + u_low + 3 * u(out)) + 2 * tiny(out)`` with ``mag`` = softmax @ |V|.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import known_issues
from .arrays import f32_to_bf16_bits, bf16_bits_to_f64

U = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
TINY = {"float64": 2.2250738585072014e-308, "float32": 1.1754943508222875e-38, "float16": 6.103515625e-05,
        "bfloat16": 1.1754943508222875e-38}
FMAX = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38, "float16": 65504.0,
        "bfloat16": 3.3895313892515355e38}
ACT_ERR = 1e-6
EXP_ERR = 4e-6

#: finding categories, in the order of the summary table's columns
CATEGORIES = ("crash", "hang", "wrong", "nontracea", "mutated", "refused_valid")


@dataclass
class Finding:
    """One thing wrong with a case."""

    category: str
    message: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {"category": self.category, "message": self.message}
        if self.detail:
            d["detail"] = self.detail
        return d


@dataclass
class Verdict:
    """Findings of one case, the known issues that explained mismatches, and ``ratio``: the largest
    ``|error| / bound`` over finite elements (how close a passing result came to failing)."""

    findings: list[Finding] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    ratio: float | None = None

    def add(self, category: str, message: str, detail: str = "") -> None:
        self.findings.append(Finding(category, message, detail))


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 ``values`` rounded to ``dtype`` and back (overflow becomes +-Inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return bf16_bits_to_f64(f32_to_bf16_bits(values.astype(np.float32)))
        if dtype in ("float16", "float32"):
            return values.astype(dtype).astype(np.float64)
    return values


#: per-product error of fp32-accurate GEMMs on Tensor Cores (3xTF32: small*small and the TF32 rounding of
#: the small parts are dropped, ~2^-21 relative; fp32 FMA kernels stay far inside it)
U3XTF32 = 2.0 ** -21


def bound(case_op: str, model: dict[str, Any], in_dtype: str, out_dtype: str, mag: np.ndarray,
          logit_mag: np.ndarray | None = None, seq_kv: int = 0) -> np.ndarray:
    """The accepted absolute error per element (see the module docstring)."""
    u_acc = U["float64"] if in_dtype == "float64" else U["float32"]
    u_out = U.get(out_dtype, U["float32"])
    tiny = 2 * TINY.get(out_dtype, TINY["float32"])
    if case_op == "attention":
        u_low = U[in_dtype] if in_dtype in ("float16", "bfloat16") else 0.0
        e = (logit_mag if logit_mag is not None else 0.0) * (model["k"] * u_acc + u_low)
        exp_err = EXP_ERR if in_dtype != "float64" else 1e-12
        return 2 * mag * (2 * e + seq_kv * u_acc + exp_err + u_low + 3 * u_out) + tiny
    k = int(model.get("k", 1))
    u_prec = 0.0
    if in_dtype == "float32":
        u_prec = {"high": 2 * 2.0 ** -11, "medium": 2 * U["bfloat16"]}.get(model.get("precision", "highest"),
                                                                             U3XTF32)
    steps = model.get("steps", [])
    acts = sum(1 for s in steps if s != "bias")
    a = ACT_ERR if in_dtype != "float64" else 1e-12
    gamma = k * u_acc / max(1e-300, 1 - k * u_acc)
    return 2 * mag * (gamma + u_prec + (2 + len(steps)) * u_out + acts * a) + tiny


def matches(got: np.ndarray, want: np.ndarray, tol: np.ndarray, out_dtype: str) -> np.ndarray:
    """Per element: ``got`` agrees with ``want`` (NaN with NaN, the same Inf, else within ``tol``)."""
    want_r = round_to(want, out_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        same_nan = np.isnan(got) & np.isnan(want_r)
        same_inf = np.isinf(got) & np.isinf(want_r) & (np.sign(got) == np.sign(want_r))
        finite = np.isfinite(got) & np.isfinite(want_r) & (np.abs(got - want) <= tol)
        near_overflow = np.isinf(got) & np.isfinite(want) & (np.abs(want) >= 0.5 * FMAX.get(out_dtype, math.inf)) \
            & (np.sign(got) == np.sign(want))
    return same_nan | same_inf | finite | near_overflow


def compare(ctx: dict[str, Any], got: np.ndarray, ref: Any, verdict: Verdict, tolerate: bool) -> None:
    """Compare a result with the reference; add a ``wrong`` finding (or a known issue) on mismatch."""
    model, out_dtype = ctx["model"], ctx["out_dtype"]
    tol = bound(ctx["op"], model, ctx["in_dtype"], out_dtype, ref.mag, ref.logit_mag, ctx.get("seq_kv", 0))
    with np.errstate(invalid="ignore"):
        tol = np.where(np.isnan(tol), np.inf, tol)
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = np.isfinite(got) & np.isfinite(ref.ref) & np.isfinite(tol) & (tol > 0)
        if finite.any():
            verdict.ratio = float(np.max(np.abs(got - ref.ref)[finite] / tol[finite]))
    ok = matches(got, ref.ref, tol, out_dtype)
    for alt in ref.alts:
        ok |= matches(got, alt, tol, out_dtype)
    if ctx["backend"] == "fallback":  # PyTorch computed it: its NaN / Inf pattern is PyTorch's business
        ok |= ~np.isfinite(round_to(ref.ref, out_dtype))
        if ctx["nonfinite_inputs"]:  # (oneDNN's bf16 conv spreads a NaN input beyond its receptive field)
            ok |= ~np.isfinite(got)
    bad = ~ok
    if not bad.any():
        return
    if tolerate:
        bad, keys = known_issues.explain({**ctx, "ref": ref.ref}, bad)
        verdict.known += keys
        if not bad.any():
            return
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(got - ref.ref) / np.where(ref.mag > 0, ref.mag, 1.0)
        worst = float(np.nanmax(np.where(bad & np.isfinite(rel), rel, np.nan))) if (bad & np.isfinite(rel)).any() else math.nan
    verdict.add("wrong", f"{int(bad.sum())} of {bad.size} elements differ from the float64 reference",
                f"first at {idx}: got {got[idx]!r}, expected {ref.ref[idx]!r} (bound {tol[idx]:.3g}, "
                f"mag {ref.mag[idx]:.3g}); worst |err|/mag {worst:.3g}")
