"""Helpers for the CUDA backend's GPU tests and benchmarks (random inputs, float64 references)."""

from __future__ import annotations

import functools
import math
from typing import Any

from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.epilogue import EpilogueKind
from tracea.ir.ops import Conv2dOp, GemmOp, Layout

from . import toolkit


def hopper_available() -> bool:
    """:func:`gpu_available` with a Hopper GPU (compute capability 9.0: wgmma, TMA)."""
    if not gpu_available():
        return False
    import torch  # noqa: PLC0415

    return torch.cuda.get_device_capability() == (9, 0)


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """CuPy works, a GPU is present and torch sees it (the tests build inputs with torch)."""
    if not toolkit.status()[0]:
        return False
    try:
        import torch  # noqa: PLC0415

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def gpu_profile():
    from .device import profile  # noqa: PLC0415

    return profile(0)


def gpu_test(fn: Any) -> Any:
    """Decorator of a GPU test: marked ``cuda`` and skipped without a CUDA GPU, CuPy and torch."""
    import pytest  # noqa: PLC0415 - test helper

    fn = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU, CuPy and torch")(fn)
    return pytest.mark.cuda(fn)


def require_hopper() -> Any:
    """The GPU's profile; skips the calling test unless the GPU has wgmma (Hopper, sm_90)."""
    import pytest  # noqa: PLC0415 - test helper

    profile = gpu_profile()
    if not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    return profile


def capture(fn: Any) -> tuple[Any, Any]:
    """``fn`` warmed up once on a side stream (as torch documents for capture), then captured into a CUDA
    graph: (graph, the output tensor the graph writes)."""
    import torch  # noqa: PLC0415 - test helper

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def assert_replays_match(fn: Any, x: Any, replays: int = 2) -> None:
    """Capture ``fn`` (:func:`capture`), then ``replays`` times: fresh random values into its input ``x`` in
    place, replay, and assert the graph's output equals an eager ``fn()`` on the same inputs, bit for bit."""
    import torch  # noqa: PLC0415 - test helper

    g, out = capture(fn)
    for _ in range(replays):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn()), "replay differs from an eager call on the same inputs"


def tf32_rna(x: Any) -> Any:
    """``cvt.rna.tf32.f32`` emulated on float32 values (a NumPy array, or a torch tensor on any device): 10
    mantissa bits, round half away from zero; NaN and Inf kept. Returns the same kind of array."""
    import numpy as np  # noqa: PLC0415 - test helper

    if hasattr(x, "detach"):  # torch: round on the host, back to x's device
        import torch  # noqa: PLC0415

        return torch.from_numpy(tf32_rna(x.detach().cpu().numpy())).to(x.device)
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def fake_profile(gpu: str):
    """A :class:`~tracea.doctor.profile.DeviceProfile` of an ``"H100"`` or ``"A100"`` (data-sheet figures),
    for Doctor and hero tests that must not depend on the GPU present."""
    from tracea.doctor.profile import DeviceProfile
    from tracea.ir.device import Device

    from .device import isa_flags

    specs = {"H100": ("sm_90a", 132, (9, 0), 232448, 989e3, 494e3, 67e3, 3350.0),
             "A100": ("sm_80", 108, (8, 0), 166912, 312e3, 156e3, 19.5e3, 2039.0)}
    arch, sms, cc, smem, f16, tf32, f32, bw = specs[gpu]
    return DeviceProfile(Device("cuda", 0), f"{gpu} (fake)", backend="cuda", arch=arch, compute_units=sms,
                         compute_capability=cc, warp_size=32, max_threads_per_block=1024,
                         shared_mem_per_block=smem, registers_per_block=65536, isa=isa_flags(cc),
                         peak_gflops={"float16": f16, "bfloat16": f16, "tf32": tf32, "float32": f32},
                         bandwidth_gbs=bw)


def doctor_on(monkeypatch: Any, profile: Any, perf_data: Any = None):
    """A Doctor over the CUDA plugin's hooks (CuPy reported usable) with ``profile`` as the only GPU (see
    :func:`fake_profile`) and, when given, ``perf_data`` as the plugin's measured performance data; the
    performance-model environment variables are cleared (``monkeypatch``: pytest's fixture)."""
    import types

    from tracea.doctor.doctor import Doctor
    from tracea.plugins import hookimpl
    from tracea.plugins import manager as m

    from . import plugin as cuda_plugin

    monkeypatch.setattr(toolkit, "status", lambda: (True, ""))
    monkeypatch.delenv("TRACEA_PERF_MODEL", raising=False)
    monkeypatch.delenv("TRACEA_PERF_DATA", raising=False)
    fake = types.ModuleType("fake_cuda_plugin")
    for name in dir(cuda_plugin):
        if name.startswith("tracea_") and name not in ("tracea_device_profiles", "tracea_backend_info",
                                                       "tracea_environment", "tracea_synchronize"):
            setattr(fake, name, getattr(cuda_plugin, name))
    fake.tracea_device_profiles = hookimpl(lambda: [profile])  # type: ignore[attr-defined]
    if perf_data is not None:
        fake.tracea_perf_data = hookimpl(lambda profile: perf_data)  # type: ignore[attr-defined]
    pm = m.TraceaPluginManager()
    for name, path in m.BUILTIN_PLUGINS:  # hero configs and search spaces come from the delegate plugin
        pm.load_module(name, path, "builtin")
    pm.register_plugin(fake, "fakecuda", "test")
    return Doctor(pm)


def torch_dtype(dtype: DType):
    import torch  # noqa: PLC0415

    return {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}[dtype.storage]


def apply_epilogue_ref(x, epilogue, bias):
    """The epilogue chain in float64 with torch (x: (..., n) or conv output with channel axis -1)."""
    import torch  # noqa: PLC0415

    for step in epilogue:
        if step is EpilogueKind.BIAS:
            x = x + bias.double()
        elif step is EpilogueKind.RELU:
            x = torch.relu(x)
        elif step is EpilogueKind.GELU_TANH:
            x = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        elif step is EpilogueKind.GELU_ERF:
            x = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
        elif step is EpilogueKind.SILU:
            x = x * torch.sigmoid(x)
    return x


def gemm_inputs(op: GemmOp, seed: int = 0) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(op.dtype_a)
    a_shape = (op.batch, op.k, op.m) if op.trans_a else (op.batch, op.m, op.k)
    b_shape = (op.batch, op.n, op.k) if op.trans_b else (op.batch, op.k, op.n)
    a = torch.randn(a_shape, generator=g, device="cuda", dtype=torch.float32).to(dt)
    b = torch.randn(b_shape, generator=g, device="cuda", dtype=torch.float32).to(dt)
    bias = (torch.randn((op.n,), generator=g, device="cuda", dtype=torch.float32).to(torch_dtype(op.out_dtype))
            if op.epilogue.has_bias else None)
    out = torch.full((op.batch, op.m, op.n), float("nan"), device="cuda", dtype=torch_dtype(op.out_dtype))
    return {"a": a, "b": b, "bias": bias, "out": out}


def gemm_reference(op: GemmOp, t: dict[str, Any]):
    a, b = t["a"].double(), t["b"].double()
    if op.trans_a:
        a = a.transpose(-1, -2)
    if op.trans_b:
        b = b.transpose(-1, -2)
    return apply_epilogue_ref(a @ b, op.epilogue, t["bias"])


def conv_inputs(op: Conv2dOp, seed: int = 0) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(op.dtype)
    x = torch.randn(op.x_shape, generator=g, device="cuda", dtype=torch.float32).to(dt)
    w = (torch.randn(op.w_shape, generator=g, device="cuda", dtype=torch.float32) /
         math.sqrt(op.c * op.r * op.s)).to(dt)
    bias = (torch.randn((op.k,), generator=g, device="cuda", dtype=torch.float32).to(torch_dtype(op.out_dtype))
            if op.epilogue.has_bias else None)
    out = torch.full(op.out_shape, float("nan"), device="cuda", dtype=torch_dtype(op.out_dtype))
    return {"x": x, "w": w, "bias": bias, "out": out}


def conv_reference(op: Conv2dOp, t: dict[str, Any]):
    import torch.nn.functional as F  # noqa: PLC0415

    x, w = t["x"].double(), t["w"].double()
    if op.layout is Layout.NHWC:
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    y = F.conv2d(x, w, stride=op.stride, padding=op.padding, dilation=op.dilation, groups=op.groups)
    y = y.permute(0, 2, 3, 1)  # channels last so the bias broadcasts
    y = apply_epilogue_ref(y, op.epilogue, t["bias"])
    return y if op.layout is Layout.NHWC else y.permute(0, 3, 1, 2)


def misalign(t: dict[str, Any], roles: tuple[str, ...] = ("x", "out")) -> dict[str, Any]:
    """Move ``t[role]`` (torch tensors) one element into a larger buffer, same values: pointers no longer
    aligned to the vector widths a kernel prefers (its scalar / narrow-vector paths must serve them)."""
    import torch

    for role in roles:
        flat = torch.empty(t[role].numel() + 1, device=t[role].device, dtype=t[role].dtype)
        view = flat[1:].view(t[role].shape)
        view.copy_(t[role])
        t[role] = view
    return t


def op_args(t: dict[str, Any]) -> OpArgs:
    arrays = {k: v for k, v in t.items() if k != "out"}
    return OpArgs(arrays, t["out"], None)


def rel_err(out, ref) -> float:
    import torch  # noqa: PLC0415

    out = out.double().reshape(ref.shape)
    if torch.isnan(out).any():
        return float("nan")
    return float(torch.linalg.norm((out - ref).flatten()) / max(float(torch.linalg.norm(ref.flatten())), 1e-300))


#: Expected relative error bound by (math, output dtype).
def tolerance(math_mode: str, out: DType) -> float:
    if out.storage is DType.BF16:
        return 1e-2
    if out.storage is DType.F16:
        return 2e-3
    return {"f16": 1e-4, "bf16": 1e-4, "tf32": 5e-3, "3xtf32": 1e-5}[math_mode]


def check_gemm_configs(variant: Any, op: GemmOp, configs: list, tol: float, seed: int = 0) -> None:
    """Run ``op`` with each config on one set of fresh inputs (output NaN-poisoned before every run) and
    assert each is valid and within ``tol`` of the float64 reference."""
    t = gemm_inputs(op, seed=seed)
    _check_configs(variant, op, configs, tol, t, gemm_reference(op, t))


def check_conv_configs(variant: Any, op: Conv2dOp, configs: list, tol: float) -> None:
    """:func:`check_gemm_configs` for a conv; ``variant`` must accept ``op`` first."""
    assert not variant.check(op, gpu_profile()), variant.check(op, gpu_profile())
    t = conv_inputs(op)
    _check_configs(variant, op, configs, tol, t, conv_reference(op, t))


def _check_configs(variant: Any, op: Any, configs: list, tol: float, t: dict, ref: Any) -> None:
    profile = gpu_profile()
    for config in configs:
        assert variant.validate_config(op, config, profile), config.key
        t["out"].fill_(float("nan"))
        variant.run(op, config, op_args(t), profile)
        err = rel_err(t["out"], ref)
        assert err <= tol, f"{op.describe()} {config.key}: rel err {err:.3g} > {tol}"
