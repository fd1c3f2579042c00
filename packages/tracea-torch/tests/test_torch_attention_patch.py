"""``tracea_torch.patch_attention``: ``F.scaled_dot_product_attention`` routed through Tracea globally or
per model, reversibly; the plan cache and the arbiter; PyTorch's backward for autograd; the
``tracea::sdpa`` custom op under ``torch.compile``; fallbacks counted with their reasons."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import tracea_torch  # noqa: E402
from tracea.runtime import plans  # noqa: E402
from tracea_torch import arbiter, fallbacks  # noqa: E402
from tracea_torch.bridge_attention import TORCH_SDPA  # noqa: E402
from tracea_torch.guards import guard_of  # noqa: E402
from tracea_torch.ops import scaled_dot_product_attention as tracea_sdpa  # noqa: E402

ORIGINAL = F.scaled_dot_product_attention


class HFStyleAttention(nn.Module):
    """A Hugging Face style self-attention block (Llama-like: GQA, causal, SDPA)."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                              enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


@pytest.fixture(autouse=True)
def _clean():
    yield
    tracea_torch.unpatch_attention()
    assert F.scaled_dot_product_attention is ORIGINAL


def _qkv(*shape, kv_heads=None, seed=0):  # noqa: ANN001, ANN002, ANN202
    g = torch.Generator().manual_seed(seed)
    b, h, s, d = shape
    kvh = kv_heads or h
    return (torch.randn(b, h, s, d, generator=g), torch.randn(b, kvh, s + 3, d, generator=g),
            torch.randn(b, kvh, s + 3, d, generator=g))


def test_functional_matches_torch_on_kernel_and_fallback_paths():
    q, k, v = _qkv(2, 4, 13, 16, kv_heads=2)
    mask = torch.rand(13, 16) < 0.8
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask.float() - 1.0},
                   {"scale": 0.2, "is_causal": True}):
        expected = TORCH_SDPA(q, k, v, enable_gqa=True, **kwargs)
        got = tracea_sdpa(q, k, v, enable_gqa=True, **kwargs)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    # bf16 on the CPU: Tracea's 16-bit kernel where the CPU has one (else PyTorch computes it, counted): either
    # way PyTorch's float32 result of the same values, rounded once
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    torch.testing.assert_close(tracea_sdpa(qb, kb, vb, enable_gqa=True).float(),
                               TORCH_SDPA(qb.float(), kb.float(), vb.float(), enable_gqa=True), atol=8e-3, rtol=8e-3)
    # dropout: PyTorch computes it (same RNG stream), counted
    before = fallbacks.total("attention", "dropout")
    torch.manual_seed(3)
    a = tracea_sdpa(q, k, v, dropout_p=0.3, enable_gqa=True)
    torch.manual_seed(3)
    torch.testing.assert_close(a, TORCH_SDPA(q, k, v, dropout_p=0.3, enable_gqa=True))
    assert fallbacks.total("attention", "dropout") == before + 1


def test_global_patch_routes_and_unpatches(monkeypatch):
    monkeypatch.setenv("TRACEA_ARBITER", "0")  # the kernel serves every call (no timing in tests)
    model = HFStyleAttention().eval()
    x = torch.randn(2, 11, 64)
    with torch.no_grad():
        expected = model(x)
        tracea_torch.patch_attention()
        assert tracea_torch.is_patched("attention")
        assert F.scaled_dot_product_attention is tracea_sdpa
        tracea_torch.patch_attention()  # idempotent
        builds = plans.stats()["builds"]
        got = model(x)
        got2 = model(x)
    assert plans.stats()["builds"] > builds  # Tracea's plans served it
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got2, got)
    tracea_torch.unpatch_attention()
    assert not tracea_torch.is_patched("attention")
    assert F.scaled_dot_product_attention is ORIGINAL


def test_per_model_patch_only_while_its_forward_runs():
    model, other = HFStyleAttention().eval(), HFStyleAttention().eval()
    seen = []

    class Spy(nn.Module):
        def forward(self, x):  # noqa: ANN001, ANN202
            seen.append(F.scaled_dot_product_attention is tracea_sdpa)
            return x

    model.add_module("spy", Spy())
    orig_forward = type(model).forward

    def fwd(self, x, mask=None):  # noqa: ANN001, ANN202
        self.spy(x)
        return orig_forward(self, x, mask)

    model.forward = fwd.__get__(model)  # an instance forward, wrapped by the patch
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        expected = model(x)
        assert tracea_torch.patch_attention(model) is model
        assert tracea_torch.is_patched("attention", model) and not tracea_torch.is_patched("attention", other)
        got = model(x)
        other(x)
    assert seen == [False, True]
    assert F.scaled_dot_product_attention is ORIGINAL  # only during the forward
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    tracea_torch.unpatch_attention(model)
    assert not tracea_torch.is_patched("attention", model)
    model(x)
    assert seen[-1] is False


def test_autograd_uses_torchs_backward():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 7, 8))
    mask = (torch.randn(7, 10) * 0.5).requires_grad_()
    out = tracea_sdpa(q, k, v, attn_mask=mask)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, mask)]
    for t in (q, k, v, mask):
        t.grad = None
    TORCH_SDPA(q, k, v, attn_mask=mask).square().sum().backward()
    for g, t in zip(grads, (q, k, v, mask)):
        torch.testing.assert_close(g, t.grad, atol=1e-5, rtol=1e-4)


def test_torch_compile_fullgraph_with_the_custom_op(monkeypatch):
    monkeypatch.setenv("TRACEA_ARBITER", "0")
    model = HFStyleAttention().eval()
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        expected = model(x)
        tracea_torch.patch_attention()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        got = compiled(x)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    # the graph holds the custom op, and training through it works
    gm = torch._dynamo.export(model)(x).graph_module if hasattr(torch._dynamo, "export") else None
    if gm is not None:
        assert "tracea.sdpa" in gm.code or "tracea::sdpa" in str(gm.graph)
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


def test_arbiter_judges_the_first_call_of_a_signature(monkeypatch):
    monkeypatch.setenv("TRACEA_ARBITER", "1")
    monkeypatch.setenv("TRACEA_CACHE_DIR", str(pytest.importorskip("tempfile").mkdtemp()))
    arbiter.reset()
    q, k, v = _qkv(1, 2, 33, 16, seed=5)
    with torch.no_grad():
        got = tracea_sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(got, TORCH_SDPA(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)
    assert any(v_.op.startswith("attention") for v_ in arbiter.verdicts())


def test_new_signature_inside_capture_runs_nothing_of_traceas(monkeypatch):
    """A signature first seen while the stream captures a CUDA graph (Hugging Face models build their masks
    only then) goes to PyTorch before any Tracea work could be queued into the graph (mask conversion,
    operand copies), is counted, and is not stored: the next call outside capture builds its plan."""
    import tracea
    from tracea_torch import bridge_attention

    q, k, v = (torch.randn(2, 4, 24, 16) for _ in range(3))
    mask = torch.rand(2, 1, 24, 24) > 0.3
    built = []
    real_attention = tracea.ops.attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        built.append(1)
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(tracea.ops, "attention", spy)
    monkeypatch.setattr(bridge_attention, "_capturing", lambda t: True)
    plans.invalidate("test")
    fallbacks.reset()
    out = bridge_attention.sdpa(q, k, v, mask)
    assert not built and torch.allclose(out, TORCH_SDPA(q, k, v, mask), atol=1e-6)
    assert fallbacks.total("attention", "inside CUDA graph capture") == 1
    monkeypatch.setattr(bridge_attention, "_capturing", lambda t: False)
    bridge_attention.sdpa(q, k, v, mask)
    assert built, "outside capture the signature's plan is built"


def test_repeated_signature_runs_the_remembered_plan(monkeypatch):
    """The patched SDPA remembers its last eager call: the same signature runs that plan without a lookup;
    another signature, a plan-cache invalidation, grad mode with a tensor that requires grad or a signature
    first seen inside capture take the full path, and every result matches PyTorch's."""
    from tracea_torch import bridge_attention
    from tracea_torch import ops as tops

    plans.invalidate("test")
    calls = []
    real = bridge_attention.sdpa_plan_for

    def spy(*args):  # noqa: ANN002, ANN202
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(bridge_attention, "sdpa_plan_for", spy)
    q, k, v = _qkv(2, 4, 13, 16, seed=7)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(tracea_sdpa(q, k, v, is_causal=True), TORCH_SDPA(q, k, v, is_causal=True),
                                       atol=2e-5, rtol=1e-4)
        assert len(calls) == 1, "the second and third calls run the remembered plan"
        q2 = torch.randn_like(q)  # other data, same signature
        torch.testing.assert_close(tracea_sdpa(q2, k, v, is_causal=True), TORCH_SDPA(q2, k, v, is_causal=True),
                                   atol=2e-5, rtol=1e-4)
        assert len(calls) == 1
        tracea_sdpa(q, k, v)  # another flag: the full path
        assert len(calls) == 2
        tracea_sdpa(q, k, v, is_causal=True)
        assert len(calls) == 3
        plans.invalidate("test")
        tracea_sdpa(q, k, v, is_causal=True)
        assert len(calls) == 4, "an invalidation drops the remembered plan"
        x = torch.randn(2, 4, 13, 16)
        torch.testing.assert_close(tracea_sdpa(x, x, x), TORCH_SDPA(x, x, x), atol=2e-5, rtol=1e-4)
        tracea_sdpa(x, x, x)
        assert len(calls) == 5, "one tensor passed three times is remembered too"
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        tracea_sdpa(qg, k, v)
    out = tracea_sdpa(qg, k, v)  # grad mode: not the remembered no-grad plan, PyTorch's backward
    out.sum().backward()
    assert qg.grad is not None and out.grad_fn is not None
    monkeypatch.setattr(bridge_attention, "_capturing", lambda t: True)
    plans.invalidate("test")
    q3 = torch.randn(1, 2, 9, 16)
    with torch.no_grad():
        tracea_sdpa(q3, q3.clone(), q3.clone())
        n = len(calls)
        tracea_sdpa(q3, q3.clone(), q3.clone())
    assert len(calls) == n + 1, "a plan for one captured call only is not remembered"
    assert tops._SDPA_MEMO[0] is None or tops._SDPA_MEMO[0][0](q3, q3.clone(), q3.clone(), tops.NO_TENSOR) is False


def test_strided_operands_on_a_variant_that_reads_packed_arrays_keep_one_output_layout():
    """Hugging Face's BSHD q / k / v on the CPU: the CPU kernel reads packed arrays, so the plan packs
    them; the first call returns the same (packed) output layout as the later ones, with PyTorch's values."""
    import tracea

    x = [torch.randn(2, 19, 4 * 16) for _ in range(3)]
    q, k, v = (t.view(2, 19, 4, 16).transpose(1, 2) for t in x)
    outs = [tracea.ops.attention(q, k, v, is_causal=True) for _ in range(3)]
    want = TORCH_SDPA(q, k, v, None, 0.0, True)
    for out in outs:
        torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    assert len({o.stride() for o in outs}) == 1, [o.stride() for o in outs]


def test_autocast_calls_cast_like_pytorch_and_are_not_remembered():
    from tracea_torch import ops as tops

    q, k, v = _qkv(2, 4, 13, 16, seed=9)
    tops._SDPA_MEMO[0] = None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = tracea_sdpa(q, k, v, is_causal=True)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert tops._SDPA_MEMO[0] is None  # a memo hit would skip the cast


@pytest.mark.parametrize("count", [None, ("attention", "test reason")])
def test_a_remembered_signature_pytorch_serves_calls_pytorch_straight(monkeypatch, count):
    """A memo whose plan PyTorch serves (the arbiter's verdict, or a counted fallback) calls PyTorch's SDPA
    from the patched function itself -- the plan is not called -- counting each call where the plan
    would; PyTorch then handles grad and autocast as the unpatched function does."""
    from tracea_torch import ops as tops

    q, k, v = _qkv(2, 4, 13, 16, seed=11)

    def boom(*args):  # noqa: ANN002, ANN202
        raise AssertionError("the plan was called")

    flags = (True, None, False)
    tops._SDPA_MEMO[0] = (guard_of(q, k, v, tops.NO_TENSOR).check, flags, False, plans.generation(), boom, True, count)
    fallbacks.reset()
    with torch.no_grad():
        outs = [tracea_sdpa(q, k, v, is_causal=True) for _ in range(3)]
    want = TORCH_SDPA(q, k, v, None, 0.0, True)
    assert all(torch.equal(o, want) for o in outs)
    assert fallbacks.total(contains="test reason") == (0 if count is None else 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = tracea_sdpa(q, k, v, is_causal=True)
        assert got.dtype == F.scaled_dot_product_attention(q, k, v, is_causal=True).dtype
    qg = q.clone().requires_grad_()
    tops._SDPA_MEMO[0] = (guard_of(qg, k, v, tops.NO_TENSOR).check, flags, True, plans.generation(), boom, True, count)
    out = tracea_sdpa(qg, k, v, is_causal=True)
    out.sum().backward()
    assert qg.grad is not None
    tops._SDPA_MEMO[0] = None


def test_only_plans_pytorch_serves_are_remembered_as_lean():
    """The memo's lean field comes from the plan: PyTorch's plans carry it, Tracea's do not."""
    from tracea_torch import bridge_attention

    verdict = bridge_attention._torch_plan((0.0, False, None, False), "verdict", False)
    counted = bridge_attention._torch_plan((0.0, False, None, False), "no kernel", True)
    assert verdict.lean is True and verdict.count is None
    assert counted.lean is True and counted.count == ("attention", "no kernel")


@pytest.mark.arbiter
@pytest.mark.parametrize("dtype,mask", [(torch.bfloat16, None), (torch.float16, "additive"), (torch.bfloat16, "bool")])
def test_16_bit_cpu_attention_is_judged_through_the_widened_fp32_kernel(monkeypatch, dtype, mask):
    """Where no CPU attention kernel reads 16-bit operands (Arm, float16 on AVX2; here: the variants made to
    decline them), a 16-bit SDPA call is timed (arbiter, under the 16-bit op) through Tracea's fp32 kernel on
    widened copies, the output rounded once; whichever side wins, the result matches PyTorch's fp32 SDPA of the
    same values within 16-bit rounding, and a Tracea win serves later calls."""
    from tracea.doctor.doctor import get_doctor
    from tracea_torch import attention_widened

    cpu_attention = pytest.importorskip("tracea_cpu.attention").CpuAttentionVariant
    real_check = cpu_attention.check
    monkeypatch.setattr(cpu_attention, "check", lambda self, op, profile: real_check(self, op, profile) + (
        [] if op.dtype.storage.value == "float32" else ["16-bit operands (this test: a CPU without such a kernel)"]))
    get_doctor().invalidate()

    tracea_wins = mask != "bool"
    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (fa(), fb(), 1e-3, 2e-3 if tracea_wins else 5e-4)[2:])
    judged, built = [], []
    real_judge, real_build = arbiter.judge, attention_widened.build
    monkeypatch.setattr(arbiter, "judge", lambda d, *a, **k: judged.append(d.op) or real_judge(d, *a, **k))

    def spy_build(*a, **k):
        out = real_build(*a, **k)
        built.append(out)
        if out is not None:
            run, decision = out

            def counted(*args):
                calls.append(1)
                return run(*args)
            return counted, decision
        return out

    calls: list[int] = []
    monkeypatch.setattr(attention_widened, "build", spy_build)
    q, k, v = (t.to(dtype) for t in _qkv(2, 3, 21, 16, seed=9))
    m = None
    if mask == "additive":
        m = (torch.randn(1, 1, 21, 24) * 0.5).to(dtype)
    elif mask == "bool":
        m = torch.rand(1, 1, 21, 24) > 0.3
    with torch.no_grad():
        outs = [tracea_sdpa(q, k, v, attn_mask=m) for _ in range(3)]
        ref = TORCH_SDPA(q.float(), k.float(), v.float(), m.float() if mask == "additive" else m)
    assert len(built) == 1 and built[0] is not None
    (op,) = judged
    assert op.dtype.value == str(dtype)[6:] and op.kind.value == "attention"
    tol = 1e-2 if dtype is torch.bfloat16 else 2e-3
    for o in outs:
        assert o.dtype == dtype and float((o.float() - ref).abs().max()) < tol * 4
    # the verdict ran it twice (the output check, the mocked timing); a Tracea win then serves all three calls
    assert len(calls) == 2 + (3 if tracea_wins else 0)
