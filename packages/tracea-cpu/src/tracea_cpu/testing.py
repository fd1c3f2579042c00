"""Helpers for testing and benchmarking the CPU backend: float64 NumPy references (GEMM epilogues,
conv2d, attention), NaN-poisoned outputs, ISA selection, a direct variant runner and a bf16 GEMM case
on torch tensors."""

from __future__ import annotations

import dataclasses

import numpy as np

from tracea import reference, testing
from tracea.doctor.host_plugin import host_profile
from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.epilogue import Epilogue
from tracea.runtime.arrays import NumpyAdapter
from tracea.semantic import PipelineConfig

from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.toolchain import compiler_or_reason

PROFILE = host_profile()
#: This host's profile as if its CPU had AMX-BF16 (and the AVX-512 it implies): for tests of how the AMX
#: variants decline (the OS's answer, the compiler), which must not depend on this CPU's own ISA.
AMX_PROFILE = PROFILE.with_(isa=tuple(dict.fromkeys(tuple(PROFILE.isa) + (
    "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"))))
HAVE_CC = compiler_or_reason()[0] is not None


def runnable_isas() -> list[str]:
    """ISAs this machine can execute, best first."""
    return [n for n in ("avx512", "avx2", "neon", "scalar")
            if ISA_BY_NAME[n].runs_here() and PROFILE.has(*ISA_BY_NAME[n].requires)]


ISAS = runnable_isas()
BEST = ISAS[0]



rel_err = testing.rel_err


def epilogue_ref(x: np.ndarray, steps, bias: np.ndarray | None, axis: int) -> np.ndarray:
    """The core reference's float64 epilogue for a sequence of steps."""
    return reference.apply_epilogue(np.asarray(x, dtype=np.float64), Epilogue(tuple(steps)), bias, axis)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def poisoned(shape) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)


def run_variant(variant, op, config: PipelineConfig, arrays: dict, out: np.ndarray) -> np.ndarray:
    variant.run(op, config, OpArgs(arrays, out, NumpyAdapter()), PROFILE)
    return out


def config(**params) -> PipelineConfig:
    return PipelineConfig(params=tuple(params.items()))


def conv2d_ref(x: np.ndarray, w: np.ndarray, op) -> np.ndarray:
    """float64 conv2d (cross-correlation) in the op's layout, before the epilogue (core reference)."""
    return reference.conv2d(dataclasses.replace(op, epilogue=Epilogue.empty()), x, w, None)


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, op) -> np.ndarray:
    """float64 scaled dot-product attention (top-left causal, GQA) from the core reference."""
    return reference.attention(op, q, k, v)


def run_gemm(variant, op, cfg: PipelineConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run GEMM ``op`` on fresh random inputs (output NaN-poisoned first); returns (out, float64
    reference, A, B as float64 in (batch, m, k) / (batch, k, n) form)."""
    rng = np.random.default_rng(seed)
    m, n, k, batch = op.m, op.n, op.k, op.batch
    a = rand(rng, batch, *((k, m) if op.trans_a else (m, k)))
    b = rand(rng, batch, *((n, k) if op.trans_b else (k, n)))
    bias = rand(rng, n) if op.epilogue.has_bias else None
    out = poisoned((batch, m, n))
    run_variant(variant, op, cfg, {"a": a, "b": b, "bias": bias}, out)
    a64 = a.astype(np.float64).transpose(0, 2, 1) if op.trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).transpose(0, 2, 1) if op.trans_b else b.astype(np.float64)
    return out, epilogue_ref(a64 @ b64, op.epilogue.steps, bias, axis=2), a64, b64


def gemm_error(variant, op, cfg: PipelineConfig, seed: int = 0) -> float:
    """Run GEMM ``op`` (:func:`run_gemm`, NaN-poisoned output checked) and return its error: the relative
    error, or for a handful of outputs without an epilogue -- where ``||out - ref|| / ||ref||`` is one
    dot product's cancellation -- 0 when every output meets the fp32 summation bound
    ``|err| <= K * eps * (|A| |B|)``, else the worst multiple of it."""
    out, ref, a64, b64 = run_gemm(variant, op, cfg, seed)
    assert not np.isnan(out).any(), "output left unwritten (NaN poison survived)"
    if op.m * op.n >= 16 or op.epilogue.steps:
        return rel_err(out, ref)
    scale = np.abs(a64) @ np.abs(b64)
    excess = np.abs(out - ref) / (op.k * np.finfo(np.float32).eps * scale + 1e-30)
    return 0.0 if excess.max() <= 1.0 else float(excess.max())


def run_bf16_gemm(variant, m: int, n: int, k: int, *, batch: int = 1, ta: bool = False, tb: bool = False,
                  epi: str = "none", out: str = "float32", cfg: PipelineConfig | None = None, seed: int = 0,
                  bias_dtype: str = "float32", nonfinite: int = 0) -> tuple:
    """Run a bf16 GEMM variant (``variant.run``) on fresh random bf16 torch tensors -- ``nonfinite`` NaN /
    +-Inf values placed in A and one in B -- into a NaN-filled output of ``out`` ("float32" or "bf16"), with
    a bias of ``bias_dtype`` where the epilogue has one; ``cfg`` None: the op's first hero. Returns (the
    output tensor, the float64 reference of the bf16 inputs)."""
    import torch  # noqa: PLC0415 - bf16 operands come as torch tensors

    from tracea.ir.ops import GemmOp  # noqa: PLC0415
    from tracea_torch.adapter import TorchAdapter  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed)
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, epilogue=Epilogue.parse(epi), dtype_a=DType.BF16,
                dtype_b=DType.BF16, dtype_out=DType.BF16 if out == "bf16" else DType.F32)
    a = torch.randn(batch, *((k, m) if ta else (m, k)), generator=g).bfloat16()
    b = torch.randn(batch, *((n, k) if tb else (k, n)), generator=g).bfloat16()
    if nonfinite:
        rng = np.random.default_rng(seed)
        for t, count in ((a, nonfinite), (b, 1)):
            flat = t.view(-1)
            for i in rng.choice(flat.numel(), size=min(count, flat.numel()), replace=False):
                flat[int(i)] = float(rng.choice([np.nan, np.inf, -np.inf]))
    bias = torch.randn(n, generator=g).to(getattr(torch, bias_dtype)) if op.epilogue.has_bias else None
    res = torch.full((batch, m, n), float("nan"), dtype=torch.bfloat16 if out == "bf16" else torch.float32)
    variant.run(op, cfg or variant.hero_configs(op, PROFILE)[0],
                OpArgs({"a": a, "b": b, "bias": bias}, res, TorchAdapter()), PROFILE)
    a64, b64 = a.double().numpy(), b.double().numpy()
    a64 = a64.transpose(0, 2, 1) if ta else a64
    b64 = b64.transpose(0, 2, 1) if tb else b64
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(a64 @ b64, op.epilogue.steps, None if bias is None else bias.double().numpy(), axis=2)
    return res, ref


def run_bf16_conv(variant, shape: tuple, *, layout: str = "NCHW", out: str = "float32", epi: str = "none",
                  cfg: PipelineConfig | None = None, seed: int = 0, bias_dtype: str | None = None,
                  nonfinite: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Run a bf16 conv2d variant (``variant.run``) on fresh random bf16 torch tensors of ``shape`` = (n, C, H, W, K,
    R, S, stride, padding, dilation[, groups]) in ``layout`` -- ``nonfinite`` NaN / +-Inf values placed in x and one in
    w -- into a NaN-filled output of ``out`` ("float32" or "bf16"), with a bias of ``bias_dtype`` (default: the output
    dtype's storage, float32 for a float32 output) where the epilogue has one; ``cfg`` None: the op's first hero.
    Asserts the inputs are left as they were. Returns (the output as float64 NCHW, the float64 reference of the bf16
    inputs)."""
    import torch  # noqa: PLC0415 - bf16 operands come as torch tensors
    import torch.nn.functional as F  # noqa: PLC0415

    from tracea.ir.ops import Conv2dOp, Layout  # noqa: PLC0415
    from tracea_torch.adapter import TorchAdapter  # noqa: PLC0415

    n, c, h, w, k, r, s, st, pd, dl, *rest = shape
    g = rest[0] if rest else 1
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen).bfloat16()
    wt = torch.randn(k, c // g, r, s, generator=gen).bfloat16()
    if nonfinite:
        rng = np.random.default_rng(seed)
        testing.inject_nonfinite(rng, x, nonfinite)
        testing.inject_nonfinite(rng, wt, 1)
    op = Conv2dOp(n, c, h, w, k, r, s, stride=pair(st), padding=pair(pd), dilation=pair(dl), groups=g,
                  layout=Layout.parse(layout), dtype=DType.BF16, dtype_out=DType.parse(out), epilogue=Epilogue.parse(epi))
    bias_dtype = bias_dtype or ("bfloat16" if out == "bf16" else "float32")
    bias = torch.randn(k, generator=gen).to(getattr(torch, bias_dtype)) if op.epilogue.has_bias else None
    ref = epilogue_ref(F.conv2d(x.double(), wt.double(), None, pair(st), pair(pd), pair(dl), g).numpy(),
                       op.epilogue.steps, None if bias is None else bias.double().numpy(), axis=1)
    xk, wk = (x, wt) if layout == "NCHW" else (x.permute(0, 2, 3, 1).contiguous(), wt.permute(0, 2, 3, 1).contiguous())
    x0, w0 = xk.clone(), wk.clone()
    res = torch.full(op.out_shape, float("nan"), dtype=torch.bfloat16 if out == "bf16" else torch.float32)
    variant.run(op, cfg or variant.hero_configs(op, PROFILE)[0], OpArgs({"x": xk, "w": wk, "bias": bias}, res,
                                                                         TorchAdapter()), PROFILE)
    assert torch.equal(xk, x0) or nonfinite and torch.equal(xk.isnan(), x0.isnan())  # inputs untouched
    assert torch.equal(wk.nan_to_num(), w0.nan_to_num())
    got = res.double().numpy()
    return (got.transpose(0, 3, 1, 2) if layout == "NHWC" else got), ref


def max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def bf16_tol(out: str) -> float:
    """Tolerance of a bf16 conv / GEMM against float64: fp32 accumulation of exact bf16 products; a bf16 output
    adds one rounding."""
    return 2e-5 if out == "float32" else 8e-3
