"""A test-only backend for the tuner tests: NumPy kernels whose speed really depends on their
blocking (tile sizes), plus configs that fail on purpose. Loaded as a plugin module
(``TRACEA_PLUGINS=testnp=tracea_tuning_testplugin``) or registered directly by :func:`make_doctor`.

Deliberate failures: a ``sleep_s`` param sleeps that long per run (timeouts), ``tile_m == 8`` raises
CompilationError, ``tile_n == 8`` leaves the last column
block unwritten (wrong result), ``tile_k == 8`` raises LaunchError. ``TESTNP_ENV`` (environment
variable) is reported through ``tracea_environment`` so a test can fake an environment change.
"""

from __future__ import annotations

import os

import numpy as np

from tracea.doctor.variant import KernelVariant, Requirements
from tracea.dtypes import DType
from tracea.errors import CompilationError, LaunchError
from tracea.ir.epilogue import EpilogueKind
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.plugins.backend_info import BackendInfo
from tracea.plugins.manager import hookimpl
from tracea.semantic.config import PipelineConfig, Validity
from tracea.semantic.search_space import SearchSpace

RUNS: list[str] = []  # config keys run in this process (tests count them)


def _epilogue(op, acc, bias):
    for step in op.epilogue:
        if step is EpilogueKind.BIAS:
            acc = acc + bias
        elif step is EpilogueKind.RELU:
            acc = np.maximum(acc, 0)
    return acc


def _fail(config):
    if config.get("sleep_s"):
        import time

        time.sleep(float(config.get("sleep_s")))
    if config.tile_m == 8:
        raise CompilationError("testnp: tile_m=8 does not compile (deliberate)", backend="testnp")
    if config.tile_k == 8:
        raise LaunchError("testnp: tile_k=8 fails to launch (deliberate)", backend="testnp")


class BlockedGemm(KernelVariant):
    name = "testnp.gemm.blocked"
    backend = "testnp"
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}), transposes=False,
                                batched=False, epilogues=frozenset({EpilogueKind.BIAS, EpilogueKind.RELU}))
    description = "NumPy blocked GEMM (tests only)"

    def search_space(self, op, profile):
        return (SearchSpace().tile_m([8, 16, 32, 64, 128]).tile_n([8, 16, 32, 64, 128])
                .tile_k([8, 16, 32, 64, 128]).warps([1]))

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=32, tile_n=32, tile_k=32, warps=1)]

    def validate_config(self, op, config, profile):
        scratch = 4 * (config.tile_m * config.tile_k + config.tile_k * config.tile_n)
        if scratch > 96 * 1024:
            return Validity(False, f"needs {scratch} B of scratch, limit 98304 B")
        return config.validate(profile)

    def run(self, op, config, args, profile):
        _fail(config)
        RUNS.append(config.key)
        a, b, out = args.host("a"), args.host("b"), args.host("out")
        bias = args.host("bias")
        tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
        n_stop = op.n - tn if config.tile_n == 8 and op.n > tn else op.n
        for i in range(0, op.m, tm):
            for j in range(0, n_stop, tn):
                acc = np.zeros((min(tm, op.m - i), min(tn, op.n - j)), dtype=np.float32)
                for p in range(0, op.k, tk):
                    acc += a[i:i + tm, p:p + tk] @ b[p:p + tk, j:j + tn]
                out[i:i + tm, j:j + tn] = _epilogue(op, acc, None if bias is None else bias[j:j + tn])


class BlockedConv(KernelVariant):
    name = "testnp.conv2d.blocked"
    backend = "testnp"
    requirements = Requirements("cpu", LayerType.CONV2D, dtypes=frozenset({DType.F32}), groups=False,
                                layouts=frozenset({Layout.NCHW}),
                                epilogues=frozenset({EpilogueKind.BIAS, EpilogueKind.RELU}))
    description = "NumPy blocked direct conv2d (tests only)"

    def search_space(self, op, profile):
        return SearchSpace().tile_n([4, 8, 16, 32]).tile_k([2, 4, 8, 16]).tile_m([1]).warps([1])

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=1, tile_n=8, tile_k=4, warps=1)]

    def run(self, op: Conv2dOp, config, args, profile):
        _fail(config)
        RUNS.append(config.key)
        x, w, out, bias = args.host("x"), args.host("w"), args.host("out"), args.host("bias")
        (ph, pw), (sh, sw), (dh, dw) = op.padding, op.stride, op.dilation
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        acc = np.zeros(op.out_shape, dtype=np.float32)
        for k0 in range(0, op.k, config.tile_n):
            for c0 in range(0, op.c, config.tile_k):
                for r in range(op.r):
                    for s in range(op.s):
                        patch = xp[:, c0:c0 + config.tile_k, r * dh: r * dh + sh * (op.p - 1) + 1: sh,
                                   s * dw: s * dw + sw * (op.q - 1) + 1: sw]
                        wk = w[k0:k0 + config.tile_n, c0:c0 + config.tile_k, r, s]
                        acc[:, k0:k0 + config.tile_n] += np.einsum("nchw,kc->nkhw", patch, wk)
        out[...] = _epilogue(op, acc.transpose(0, 2, 3, 1), bias).transpose(0, 3, 1, 2) \
            if bias is not None else _epilogue(op, acc, None)


@hookimpl
def tracea_register_variants():
    return [BlockedGemm(), BlockedConv()]


@hookimpl
def tracea_backend_info():
    return BackendInfo("testnp", "0.1.0", package="tracea-tuning-tests")


@hookimpl
def tracea_environment(profile):
    if profile.device.kind != "cpu":
        return None
    return {"testnp_env": os.environ.get("TESTNP_ENV", "1")}


def make_doctor():
    """Make the process-wide plugin manager core's built-ins plus this plugin (no other backend, so
    results do not depend on which backends are installed) and return the Doctor over it."""
    import sys

    from tracea.doctor.doctor import get_doctor
    from tracea.plugins import manager as m

    pm = m.TraceaPluginManager()
    for name, path in m.BUILTIN_PLUGINS:
        pm.load_module(name, path, "builtin")
    pm.register_plugin(sys.modules[__name__], "testnp", "test")
    pm.check_pending()
    m.set_plugin_manager(pm)
    return get_doctor()
