"""Helpers for testing and benchmarking the CPU backend: float64 NumPy references (GEMM epilogues,
conv2d, attention), NaN-poisoned outputs, ISA selection and a direct variant runner."""

from __future__ import annotations

import math

import numpy as np


from tracea.doctor.host_plugin import host_profile
from tracea.doctor.variant import OpArgs
from tracea.ir.epilogue import EpilogueKind
from tracea.runtime.arrays import NumpyAdapter
from tracea.semantic import PipelineConfig

from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.toolchain import compiler_or_reason

PROFILE = host_profile()
HAVE_CC = compiler_or_reason()[0] is not None


def runnable_isas() -> list[str]:
    """ISAs this machine can execute, best first."""
    return [n for n in ("avx512", "avx2", "neon", "scalar")
            if ISA_BY_NAME[n].runs_here() and PROFILE.has(*ISA_BY_NAME[n].requires)]


ISAS = runnable_isas()
BEST = ISAS[0]



def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom else 1.0))


def epilogue_ref(x: np.ndarray, steps, bias: np.ndarray | None, axis: int) -> np.ndarray:
    from scipy.special import erf

    for s in steps:
        if s is EpilogueKind.BIAS:
            shape = [1] * x.ndim
            shape[axis] = -1
            x = x + bias.astype(np.float64).reshape(shape)
        elif s is EpilogueKind.RELU:
            x = np.maximum(x, 0)
        elif s is EpilogueKind.GELU_TANH:
            x = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        elif s is EpilogueKind.GELU_ERF:
            x = 0.5 * x * (1 + erf(x / math.sqrt(2)))
        elif s is EpilogueKind.SILU:
            x = x / (1 + np.exp(-x))
    return x


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
    """float64 conv2d (cross-correlation) in the op's layout, before the epilogue."""
    from tracea.ir.ops import Layout

    x64 = x.astype(np.float64)
    w64 = w.astype(np.float64)
    if op.layout is Layout.NHWC:
        x64 = x64.transpose(0, 3, 1, 2)
        w64 = w64.transpose(0, 3, 1, 2)
    (sh, sw), (ph, pw), (dh, dw) = op.stride, op.padding, op.dilation
    xp = np.pad(x64, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    g, cg, kg = op.groups, op.c // op.groups, op.k // op.groups
    out = np.zeros((op.n, op.k, op.p, op.q))
    for gi in range(g):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w64[gi * kg:(gi + 1) * kg]
        for r in range(op.r):
            for s in range(op.s):
                patch = xs[:, :, r * dh: r * dh + sh * (op.p - 1) + 1: sh, s * dw: s * dw + sw * (op.q - 1) + 1: sw]
                out[:, gi * kg:(gi + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, ws[:, :, r, s])
    return out.transpose(0, 2, 3, 1) if op.layout is Layout.NHWC else out


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, op) -> np.ndarray:
    """float64 scaled dot-product attention (top-left causal, GQA by repeating kv heads)."""
    rep = op.heads // int(op.kv_heads)
    k64 = np.repeat(k.astype(np.float64), rep, axis=1)
    v64 = np.repeat(v.astype(np.float64), rep, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k64) * op.scale
    if op.causal:
        i = np.arange(op.seq_q)[:, None]
        j = np.arange(op.seq_kv)[None, :]
        s = np.where(j <= i, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v64)
