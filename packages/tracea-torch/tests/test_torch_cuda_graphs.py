"""CUDA-graph safety of every CUDA variant path (skipped without a GPU): each is run eagerly, captured in a
CUDA graph, replayed on new inputs and compared with an eager run on the same inputs; a first call inside a
capture is refused cleanly (PyTorch computes it) and leaves the process able to capture again; patched
models run in graphs and under torch.compile."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea
import tracea_torch
from tracea_cuda.testing import capture as _capture  # warm-up on a side stream, then the graph capture
from tracea_torch import fallbacks

pytestmark = [pytest.mark.cuda, pytest.mark.torch,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

DEV = "cuda"


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _hopper() -> bool:
    return torch.cuda.get_device_capability() >= (9, 0)


def _gemm_case(variant, dtype, ta=False, tb=False, m=200, n=136, k=96, config=None, bias=True, prec=None):
    def make():
        a = torch.randn(k, m, device=DEV, dtype=dtype).t() if ta else torch.randn(m, k, device=DEV, dtype=dtype)
        b = torch.randn(n, k, device=DEV, dtype=dtype).t() if tb else torch.randn(k, n, device=DEV, dtype=dtype)
        c = torch.randn(n, device=DEV, dtype=dtype) if bias else None
        return [a, b, c]

    def call(t):
        return tracea.ops.matmul(t[0], t[1], bias=t[2], activation="relu", variant=variant, config=config,
                                 fp32_precision=prec)

    def ref(t):
        out = t[0].double() @ t[1].double() + (t[2].double() if t[2] is not None else 0)
        return torch.relu(out)

    return make, call, ref


def _conv_case(variant, dtype, channels_last, c=64, k=64, config=None, prec=None):
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def make():
        x = torch.randn(4, c, 14, 14, device=DEV, dtype=dtype).contiguous(memory_format=fmt)
        w = (torch.randn(k, c, 3, 3, device=DEV, dtype=dtype) / (3 * c ** 0.5)).contiguous(memory_format=fmt)
        return [x, w, torch.randn(k, device=DEV, dtype=dtype)]

    def call(t):
        return tracea.ops.conv2d(t[0], t[1], t[2], padding=1, activation="silu", variant=variant, config=config,
                                 fp32_precision=prec)

    def ref(t):
        return F.silu(F.conv2d(t[0].double(), t[1].double(), t[2].double(), padding=1))

    return make, call, ref


def _cases():
    from tracea_cuda.variants.base import hero
    from tracea_cuda.variants.hopper import _hero

    cases = {
        "mma_f16": _gemm_case("cuda.gemm.mma_f16", torch.float16),
        "mma_bf16_tb": _gemm_case("cuda.gemm.mma_f16", torch.bfloat16, tb=True),
        "mma_tf32": _gemm_case("cuda.gemm.mma_tf32", torch.float32, ta=True, prec="high"),
        "mma_3xtf32": _gemm_case("cuda.gemm.mma_3xtf32", torch.float32, prec="highest"),
        "implicit_nhwc_f16": _conv_case("cuda.conv2d.implicit_mma", torch.float16, True),
        "implicit_nchw_f32_direct": _conv_case("cuda.conv2d.implicit_mma", torch.float32, False, prec="high",
                                               config=hero(64, 64, 32, 3, 4, warp_m=2)),
        "implicit_nchw_f32_transform": _conv_case("cuda.conv2d.implicit_mma", torch.float32, False, prec="high",
                                                  config=hero(64, 64, 32, 3, 4, warp_m=2).replace(
                                                      nchw_mode="transform")),
        "implicit_splitk": _conv_case("cuda.conv2d.implicit_mma", torch.float16, True, c=256,
                                      config=hero(64, 64, 32, 4, 4, warp_m=2).replace(split_k=2)),
    }
    if _hopper():
        cases.update({
            "wgmma_bf16": _gemm_case("cuda.gemm.wgmma", torch.bfloat16, m=256, n=256, k=128),
            "wgmma_f16_tb": _gemm_case("cuda.gemm.wgmma", torch.float16, tb=True, m=256, n=256, k=128),
            "wgmma_pitched_copies": _gemm_case("cuda.gemm.wgmma", torch.bfloat16, m=300, n=257, k=131),
            "wgmma_stream_k": _gemm_case("cuda.gemm.wgmma", torch.bfloat16, m=512, n=512, k=512,
                                         config=_hero(256, 4, cluster=1, stream_k=True)),
            "wgmma_split_k": _gemm_case("cuda.gemm.wgmma", torch.bfloat16, tb=True, m=200, n=384, k=2000,
                                        config=_hero(128, 6, cluster=1, split_k=4)),
            "wgmma_tf32_split_k": _gemm_case("cuda.gemm.wgmma_tf32", torch.float32, m=130, n=256, k=1024,
                                             prec="high", config=_hero(128, 6, cluster=1, split_k=3,
                                                                       smem_epilogue=False)),
            "wgmma_tf32_swapped": _gemm_case("cuda.gemm.wgmma_tf32", torch.float32, m=256, n=256, k=128, prec="high"),
            "wgmma_tf32_transposed_b": _gemm_case("cuda.gemm.wgmma_tf32", torch.float32, ta=True, m=256, n=256,
                                                  k=128, prec="high"),
            "wgmma_3xtf32": _gemm_case("cuda.gemm.wgmma_3xtf32", torch.float32, m=256, n=256, k=128,
                                       prec="highest"),
            "wgmma_conv_nhwc_bf16": _conv_case("cuda.conv2d.wgmma", torch.bfloat16, True),
            "wgmma_conv_nchw_f32": _conv_case("cuda.conv2d.wgmma", torch.float32, False, prec="high"),
        })
    return cases


CASES = _cases() if torch.cuda.is_available() else {}
_TOL = {torch.float16: 2e-2, torch.bfloat16: 3e-2, torch.float32: 5e-3}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_variant_path_captures_and_replays(name):
    make, call, ref = CASES[name]
    static = make()
    eager = call(static)  # the first call binds (compiles) outside any capture
    dtype = static[0].dtype
    tol = 2e-6 if "3xtf32" in name else _TOL[dtype]
    assert _rel(eager, ref(static)) < tol
    graph, out = _capture(lambda: call(static))
    for _ in range(2):
        fresh = make()
        for s, f in zip(static, fresh):
            if s is not None:
                s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, ref(static)) < tol, name
        assert torch.equal(out, call(static)), f"{name}: replay differs from an eager call on the same inputs"


def test_first_call_inside_capture_is_refused_and_capture_stays_usable():
    """A signature first seen inside a capture cannot compile there: tracea-torch lets PyTorch compute it
    (the capture stays valid), and the process can capture again, this time with Tracea's kernel."""
    conv = nn.Conv2d(32, 48, 3, padding=1).to(DEV).to(memory_format=torch.channels_last).half()
    x = torch.randn(3, 32, 13, 11, device=DEV, dtype=torch.half).contiguous(memory_format=torch.channels_last)
    tracea_torch.patch_conv2d(conv)
    try:
        # PyTorch's own warm-up (cuDNN's handle and this convolution's engine, which cannot be set up inside
        # a capture: a worker whose first cuDNN call was the captured one failed with
        # CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, unpatched or not); Tracea has not seen the call
        F.conv2d(x, conv.weight, conv.bias, padding=1)
        torch.cuda.synchronize()
        fallbacks.reset()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):  # no warm-up: the first call of this signature is captured
                out = conv(x)
        g.replay()
        torch.cuda.synchronize()
        ref = F.conv2d(x.float(), conv.weight.float(), conv.bias.float(), padding=1)
        assert _rel(out, ref) < 2e-2
        assert any("capture" in reason for (_, reason) in fallbacks.counts()), fallbacks.counts()
        conv(x)  # eager: binds Tracea's kernel
        fallbacks.reset()
        g2, out2 = _capture(lambda: conv(x))
        g2.replay()
        torch.cuda.synchronize()
        assert _rel(out2, ref) < 2e-2 and not fallbacks.counts()
    finally:
        tracea_torch.unpatch_conv2d(conv)


def _small_cnn(dtype, channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    m = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                      nn.Conv2d(64, 128, 3, 1, 1), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 10))
    return m.to(device=DEV, dtype=dtype, memory_format=fmt).eval(), fmt


@pytest.mark.parametrize("dtype,channels_last", [(torch.float16, True), (torch.float32, False)])
def test_patched_model_in_cuda_graph_matches_eager(dtype, channels_last):
    model, fmt = _small_cnn(dtype, channels_last)
    patched = copy.deepcopy(model)
    tracea_torch.patch_conv2d(patched)
    tracea_torch.patch_linear(patched)
    x = torch.randn(8, 3, 32, 32, device=DEV, dtype=dtype).contiguous(memory_format=fmt)
    with torch.no_grad():
        ref = model(x)
        g, out = _capture(lambda: patched(x))
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert _rel(out, model(x)) < (3e-2 if dtype != torch.float32 else 5e-3)
        assert _rel(patched(x), model(x)) < (3e-2 if dtype != torch.float32 else 5e-3)
        del ref


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_patched_model_under_torch_compile(mode):
    model, fmt = _small_cnn(torch.float16, True)
    patched = copy.deepcopy(model)
    tracea_torch.patch_conv2d(patched)
    tracea_torch.patch_linear(patched)
    x = torch.randn(8, 3, 32, 32, device=DEV, dtype=torch.float16).contiguous(memory_format=fmt)
    torch._dynamo.reset()
    compiled = torch.compile(patched, mode=None if mode == "default" else mode)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x)
        torch.cuda.synchronize()
        assert _rel(out, model(x)) < 3e-2
    graph_text = "\n".join(str(g) for g in getattr(torch._dynamo.utils, "counters", {}).get("stats", {}))
    del graph_text


def test_custom_ops_are_in_the_compiled_graph():
    """torch.compile keeps tracea::conv2d / tracea::linear as opaque nodes (fullgraph) on CUDA too."""
    model, fmt = _small_cnn(torch.float16, True)
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    seen = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(2, 3, 32, 32, device=DEV, dtype=torch.float16).contiguous(memory_format=fmt)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(x)
    assert any("tracea.conv2d" in s for s in seen) and any("tracea.linear" in s for s in seen), seen
