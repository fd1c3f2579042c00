"""From ``F.scaled_dot_product_attention``'s arguments to Tracea and back: the body of the
``tracea::sdpa`` custom op and of the patched function (see :func:`tracea_torch.patch_attention`).

A call computes its signature (the tensors' shapes, strides, dtypes and devices and the other
arguments) and runs the plan stored for it in :mod:`tracea.runtime.plans`. The first call of a signature
builds the plan: ``tracea.ops.attention`` on the tensors (its own plan does the arguments and the
kernel launch), judged against PyTorch's SDPA by the arbiter (:mod:`tracea_torch.arbiter`: timed on
that first call, the faster one serves the signature; on CUDA eager and graph-captured calls have
their own winners), or PyTorch's SDPA itself, counted in :mod:`tracea_torch.fallbacks` with the reason,
when no Tracea kernel serves the call (dropout, a dtype or mask no kernel takes, only the reference
oracle accepting it) or the first call happens inside a CUDA graph capture (then nothing is stored, and
nothing of Tracea's runs: a plan build would queue work into the graph before finding that no kernel may
load).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tracea.errors import BackendError, CaptureError, NoVariantError, TraceaError, UnsupportedDeviceError
from tracea.runtime import plans
from tracea.runtime.dispatch import fallback_reason
from tracea.runtime.plans import _SIGS, Uncacheable, lookup, signature

from . import arbiter, attention_widened, fallbacks
from .adapter import stream_capturing
from .bridge_plans import _backend_failure, routed_plan

#: PyTorch's own SDPA (the C function ``F.scaled_dot_product_attention`` is), immune to the patch.
TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` through the plan of this call's signature."""
    return sdpa_plan_for(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0](q, k, v, attn_mask)


def sdpa_plan_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                  dropout_p: float, is_causal: bool, scale: float | None,
                  enable_gqa: bool) -> tuple[Callable[..., torch.Tensor], bool]:
    """``(plan, kept)``: the plan of this call's signature (looked up, or built and stored), called as
    ``plan(q, k, v, attn_mask)``; ``kept``: whether it is the stored plan of the signature (False for a
    plan serving this call only, e.g. one built inside CUDA graph capture: not to be remembered)."""
    try:
        try:  # the signatures without the frames of plans.signature in the common case
            sq, sk, sv, sm = _SIGS[type(q)](q), _SIGS[type(k)](k), _SIGS[type(v)](v), _SIGS[type(attn_mask)](attn_mask)
        except KeyError:
            sq, sk, sv, sm = signature(q), signature(k), signature(v), signature(attn_mask)
        key: Any = ("torch.sdpa", sq, sk, sv, sm, dropout_p, is_causal, scale, enable_gqa)
        plan = lookup(key)
    except (Uncacheable, TypeError):
        key = plan = None
    if plan is not None:
        return plan, True
    plan = sdpa_plan(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return plan, key is not None and lookup(key) is plan


def _capturing(q: torch.Tensor) -> bool:
    """Whether ``q``'s device's current stream is capturing a CUDA graph."""
    return q.is_cuda and bool(_is_capturing())


_is_capturing = stream_capturing()


def _torch_plan(conf: tuple, reason: str, count_each_call: bool) -> Callable[..., torch.Tensor]:
    """PyTorch's SDPA for a signature; each call counted (a fallback) or not (the arbiter's verdict is
    counted once where it is reached)."""
    dropout_p, is_causal, scale, enable_gqa = conf
    record = fallbacks.record
    sdpa = _torch_sdpa(dropout_p, is_causal, scale, enable_gqa)

    if count_each_call:
        def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
            record("attention", reason)
            return sdpa(q, k, v, m)
    else:
        def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
            return sdpa(q, k, v, m)

    plan.fallback = reason  # type: ignore[attr-defined]
    # as a patched layer's lean plan (bridge_plans._leaned): the patched function's memo may call
    # PyTorch's SDPA itself (it handles grad, autocast and modes), counting ``count`` per call
    plan.lean = True  # type: ignore[attr-defined]
    plan.count = ("attention", reason) if count_each_call else None  # type: ignore[attr-defined]
    return plan


def _torch_sdpa(dropout_p: float, is_causal: bool, scale: float | None,
                enable_gqa: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """PyTorch's SDPA with these arguments bound, as ``fn(q, k, v, mask)`` (positional only where the
    defaults allow: keyword arguments cost ~0.7 us more per call)."""
    if scale is None and not enable_gqa:
        return lambda q, k, v, m: TORCH_SDPA(q, k, v, m, dropout_p, is_causal)
    return lambda q, k, v, m: TORCH_SDPA(q, k, v, m, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _store(key: Any, plan: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return plans.store(key, plan) if key is not None else plan


def _served_gqa(q: torch.Tensor, k: torch.Tensor, enable_gqa: bool) -> bool:
    """PyTorch refuses head counts that neither match nor broadcast without ``enable_gqa``; so does the
    patched function (PyTorch raises its own error)."""
    return enable_gqa or q.dim() < 3 or k.dim() < 3 or q.shape[-3] == k.shape[-3] or 1 in (q.shape[-3], k.shape[-3])


def core_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None, is_causal: bool,
              scale: float | None, enable_gqa: bool) -> Any:
    """``tracea.ops.attention``'s own plan for these tensors (built and stored by a first call on them, which
    also computes it), or None; raises what that call raises (and :class:`Uncacheable`)."""
    from tracea import ops

    core_key: Any = ("attention", signature(q), signature(k), signature(v), signature(m), None, 0.0,
                     is_causal, scale, enable_gqa, None, None)
    ops.attention(q, k, v, m, 0.0, is_causal, scale, enable_gqa)
    return lookup(core_key)


def sdpa_plan(key: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None, dropout_p: float,
              is_causal: bool, scale: float | None, enable_gqa: bool) -> Callable[..., torch.Tensor]:
    """Build (and store under ``key``) the plan of one SDPA call signature."""
    conf = (dropout_p, is_causal, scale, enable_gqa)
    if dropout_p:
        return _store(key, _torch_plan(conf, f"dropout_p={dropout_p:g}: no Tracea kernel applies dropout", True))
    if not _served_gqa(q, k, enable_gqa):
        return _torch_plan(conf, "arguments PyTorch rejects", False)  # PyTorch raises its own error
    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3 or q.numel() == 0 or k.numel() == 0:
        return _store(key, _torch_plan(conf, "empty or low-rank operands", True))
    if _capturing(q):  # building would queue work (mask conversion, operand copies) into the graph before
        # finding out that no kernel may load now: PyTorch computes this call, nothing is stored
        return _torch_plan(conf, "first call of this signature inside CUDA graph capture (run it once before "
                           "capturing; Hugging Face models build masks only while capturing)", True)
    reason = "no Tracea plan for these tensors"
    try:
        core = core_plan(q, k, v, m, is_causal, scale, enable_gqa)
    except CaptureError as exc:  # first call inside a CUDA graph capture: PyTorch, this call only
        return _torch_plan(conf, f"inside CUDA graph capture ({str(exc).splitlines()[0][:160]})", True)
    except BackendError as exc:
        return _store(key, _torch_plan(conf, _backend_failure(exc), True))
    except (NoVariantError, UnsupportedDeviceError) as exc:
        core, reason = None, fallback_reason(exc)
    except TraceaError as exc:
        return _store(key, _torch_plan(conf, str(exc).splitlines()[0][:200], True))
    except Uncacheable:
        core = None
    run = getattr(core, "runner", None)
    decision = getattr(run, "decision", None)
    if run is None or run.launch is None or decision is None:
        reason = getattr(run, "reason", None) or reason
        wide = (attention_widened.build(q, k, v, m, is_causal, scale, enable_gqa)
                if attention_widened.applies(q) and arbiter.enabled() else None)
        if wide is None:
            return _store(key, _torch_plan(conf, reason, True))
        tracea_run, decision = wide  # 16-bit on the CPU: Tracea's fp32 kernel on widened copies, if judged faster
    else:
        def tracea_run(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor, mm: torch.Tensor | None) -> torch.Tensor:
            return core(qq, kk, vv, mm, None)  # type: ignore[misc]

        tracea_run.op = run.op  # type: ignore[attr-defined]

    torch_run = _torch_sdpa(0.0, is_causal, scale, enable_gqa)
    if not arbiter.enabled():
        return _store(key, tracea_run)
    try:
        verdict = arbiter.judge(decision, q.device, tracea_run, torch_run, (q, k, v, m))
    except CaptureError as exc:
        return _torch_plan(conf, f"inside CUDA graph capture ({str(exc).splitlines()[0][:160]})", True)
    except BackendError as exc:
        return _store(key, _torch_plan(conf, _backend_failure(exc), True))
    if verdict.winner == "tracea" and verdict.captured_winner == "tracea":
        return _store(key, tracea_run)
    fallbacks.record("attention", verdict.reason)  # once per signature, not per call
    torch_plan = _torch_plan(conf, verdict.reason, False)
    if verdict.winner == verdict.captured_winner:
        return _store(key, torch_plan)
    return _store(key, routed_plan(verdict, tracea_run, torch_plan))
