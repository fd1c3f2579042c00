"""Helpers for the attention GPU tests: random torch inputs and a float64 reference (PyTorch's top-left
causal convention, GQA heads repeated, bool / additive masks, fully masked rows giving 0) with the
optional log-sum-exp."""

from __future__ import annotations

from typing import Any, Callable, Iterator


def attention_inputs(case: tuple[int, int, int, int, int, int], dt: str, seed: int) -> tuple[Any, Any, Any]:
    """Fresh random CUDA tensors q (B, H, Sq, D), k and v (B, KVH, Skv, D) of torch dtype name ``dt`` for
    ``case = (B, H, KVH, Sq, Skv, D)``."""
    import torch

    b, h, kvh, sq, skv, d = case
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, kvh, skv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, kvh, skv, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def attention_ref(q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False, scale: float | None = None,
                  return_lse: bool = False) -> Any:
    """``softmax(scale q k^T [+ mask]) v`` in float64 on the CPU (B, H, Sq, Dv); with ``return_lse`` the pair
    (out, lse), lse (B, H, Sq) = log of the sum of exp of the scaled, masked logits (-inf when all are -inf)."""
    import torch

    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    if rep > 1:
        k64, v64 = k64.repeat_interleave(rep, -3), v64.repeat_interleave(rep, -3)
    s = (q64 @ k64.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        m = mask.cpu()
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.double()
    mx = s.amax(-1, keepdim=True)
    msafe = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
    p = torch.exp(s - msafe)
    tot = p.sum(-1, keepdim=True)
    out = (p / torch.where(tot == 0, torch.ones_like(tot), tot)) @ v64
    if not return_lse:
        return out
    return out, (msafe + torch.log(tot))[..., 0]


def graph_replays(call: Callable[[], Any], inputs: tuple[Any, ...], seeds: tuple[int, ...] = (1, 2)) -> Iterator[tuple[int, Any]]:
    """``call()`` captured in a CUDA graph (after a call outside the capture to compile and bind, and one on
    the capture's side stream); for each seed the ``inputs`` are refilled in place with fresh random
    values, the graph is replayed and synchronised, and ``(seed, what the captured call returned)`` is
    yielded."""
    import torch

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            out = call()
    for seed in seeds:
        g = torch.Generator(device="cuda").manual_seed(seed)
        for t in inputs:
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        yield seed, out


def rel(got: Any, ref: Any) -> float:
    """||got - ref|| / ||ref|| in float64 (got moved to the CPU)."""
    return float((got.double().cpu() - ref).norm() / ref.norm())


def lse_close(got: Any, ref: Any, atol: float = 2e-3) -> str | None:
    """None when the float32 log-sum-exp ``got`` matches the float64 ``ref``: the same -inf entries and
    |got - ref| <= atol * (1 + |ref|) elsewhere; else a message naming the worst entry."""
    import torch

    g = got.double().cpu()
    if g.shape != ref.shape:
        return f"shape {tuple(g.shape)} != {tuple(ref.shape)}"
    ninf_g, ninf_r = g == float("-inf"), ref == float("-inf")
    if not torch.equal(ninf_g, ninf_r):
        return f"-inf at {int((ninf_g != ninf_r).sum())} entries differ"
    fin = ~ninf_r
    err = ((g - ref).abs() / (1 + ref.abs()))[fin]
    if err.numel() and not bool(torch.isfinite(g[fin]).all()):
        return "non-finite log-sum-exp where the reference is finite"
    if err.numel() and float(err.max()) > atol:
        return f"max error {float(err.max()):.3g} > {atol}"
    return None


__all__ = ["attention_inputs", "attention_ref", "graph_replays", "lse_close", "rel"]
