"""Tracea: fast deep-learning kernels on whatever hardware you have.

Describe an op, let the Doctor pick the kernel variant that fits the machine, tune its config with a
Bayesian tuner, cache the result per hardware fingerprint and run it::

    import numpy as np, tracea
    a = np.random.rand(512, 256).astype(np.float32)
    b = np.random.rand(256, 128).astype(np.float32)
    c = tracea.ops.matmul(a, b, bias=np.zeros(128, np.float32), activation="gelu")

See the README and docs/ for the architecture, the plugin guide and tuning.
"""

from __future__ import annotations

from typing import Any

from . import errors, ops
from ._version import __version__
from .context import Context
from .doctor import Decision, DeviceProfile, Doctor, KernelVariant, OpArgs, Requirements, get_doctor
from .dtypes import DType, Fp32Precision, bf16, f16, f32, f64, fp8_e4m3, fp8_e5m2, int8, tf32
from .errors import (BackendError, CaptureError, CompilationError, DTypeError, InvalidArgumentError, LaunchError, NoVariantError,
                     ShapeError, TraceaError, UnsupportedConfigError, UnsupportedDeviceError, UnsupportedOptionError,
                     VerificationError)
from .gpuinfo import GPUInfo
from .graph import Graph
from .runtime.first_use import set_tuning, tuning_mode
from .ir import (AttentionOp, Conv2dOp, Device, Epilogue, EpilogueKind, GemmOp, LayerType, Layout,
                 ProblemDescriptor, Shape)
from .semantic import BarrierMode, PipelineConfig, SearchSpace, SwizzleMode
from .tuning.goals import OptimizationGoal

_TORCH_NAMES = ("patch_conv2d", "unpatch_conv2d", "TraceaConv2d", "patch_linear", "unpatch_linear", "TraceaLinear")
_TUNING_NAMES = {"AutoTuner": "tracea.tuning.autotuner", "tune_kernel": "tracea.usertune.interface",
                 "run_kernel": "tracea.usertune.interface", "kernel": "tracea.usertune.decorator",
                 "KernelLaunch": "tracea.usertune.decorator"}


def __getattr__(name: str) -> Any:
    # torch integration and the tuner load lazily: core imports without torch or optuna being imported.
    if name in _TORCH_NAMES:
        try:
            import tracea_torch
        except ImportError as exc:
            raise ImportError(f"tracea.{name} needs the PyTorch integration: pip install tracea-torch "
                              f"(or ./packages/tracea-torch from a checkout) [{exc}]") from exc
        return getattr(tracea_torch, name)
    if name in _TUNING_NAMES:
        import importlib

        return getattr(importlib.import_module(_TUNING_NAMES[name]), name)
    raise AttributeError(f"module 'tracea' has no attribute {name!r}")


__all__ = [
    "AttentionOp", "AutoTuner", "BackendError", "BarrierMode", "CaptureError", "CompilationError", "Context", "Conv2dOp",
    "DType", "DTypeError", "Decision", "Device", "DeviceProfile", "Doctor", "Epilogue", "EpilogueKind",
    "Fp32Precision", "GPUInfo", "GemmOp", "Graph", "InvalidArgumentError", "KernelLaunch", "KernelVariant", "LaunchError",
    "LayerType", "Layout", "NoVariantError", "OpArgs", "OptimizationGoal", "PipelineConfig", "ProblemDescriptor",
    "Requirements", "SearchSpace", "Shape", "ShapeError", "SwizzleMode", "TraceaConv2d", "TraceaError",
    "TraceaLinear", "UnsupportedConfigError", "UnsupportedDeviceError", "UnsupportedOptionError", "VerificationError", "__version__", "bf16", "errors", "f16",
    "f32", "f64", "fp8_e4m3", "fp8_e5m2", "get_doctor", "int8", "kernel", "ops", "run_kernel", "patch_conv2d", "patch_linear", "set_tuning", "tf32", "tune_kernel", "tuning_mode",
    "unpatch_conv2d", "unpatch_linear",
]
