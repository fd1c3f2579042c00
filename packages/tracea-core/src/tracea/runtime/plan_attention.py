"""The plan of ``tracea.ops.attention``: the arguments of ``torch.nn.functional.scaled_dot_product_attention``
turned into an :class:`AttentionOp` on (batch, heads, seq, head_dim) arrays: packed ones, or q / k / v as
the caller laid them out when they are strided but fold into one batch with a unit-stride head_dim
(``AttentionOp.strides``, :mod:`tracea.runtime.attention_strides`): a variant that takes strides reads
them in place and writes an output allocated in q's storage order when q is (batch, seq, heads, dim)
memory; any other variant is handed packed copies (by :func:`tracea.runtime.dispatch.bind`), and the
plan's calls (the first one too) then pack in the plan and allocate a packed output.

What the signature fixes is worked out once: the leading batch dimensions of q, k and v broadcast
against each other and are folded into one batch (a broadcast operand is materialised on every call,
a packed one is only viewed); ``attn_mask`` (boolean or additive, broadcastable to
(..., heads, seq_q, seq_kv)) becomes a packed (mask_batch, mask_heads, seq_q, seq_kv) array of the
input dtype, with mask_batch / mask_heads 1 where the mask broadcasts (a mask that must be converted,
boolean or broadcast over seq_q, is converted once per version of the same mask object: see
:func:`_memoised`); ``dropout_p`` > 0 is described in
the op so that no kernel takes it (torch tensors: PyTorch computes the call, counted as a fallback;
other arrays: :class:`~tracea.errors.NoVariantError` naming the reason). ``return_lse`` makes the op
ask for the log-sum-exp output (``AttentionOp.lse``): each call allocates a float32 (..., heads, seq_q)
array and the launcher takes it after the mask; the plan returns ``(out, lse)``. A framework fallback
does not give the log-sum-exp, so such a call raises :class:`~tracea.errors.NoVariantError`.
"""

from __future__ import annotations

import math
import numbers
import weakref
from typing import Any, Callable

import numpy as np

from ..doctor.doctor import get_doctor
from ..dtypes import DType
from ..errors import DTypeError, InvalidArgumentError, NoVariantError, ShapeError
from ..ir.ops import AttentionOp
from . import attention_strides as strided, dispatch, fallbacks, operands as ops_args
from .plan_ops import _deliver, _finish, _out_checks, retrying

_BOOL_DTYPES = ("bool", "torch.bool")


def is_bool_array(obj: Any) -> bool:
    """Whether ``obj`` holds booleans (NumPy, CuPy and torch spell the dtype ``bool`` / ``torch.bool``)."""
    return str(getattr(obj, "dtype", "")) in _BOOL_DTYPES


def _broadcast(name: str, obj: Any, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast of leading-dimension shapes (NumPy's rules), or ShapeError naming ``name``."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(n):
        sizes = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0} - {1}
        if len(sizes) > 1:
            raise ShapeError(name, obj, f"leading (batch) dimensions that broadcast with q's, k's and v's "
                                        f"({', '.join(str(s) for s in shapes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _expanded(adapter: Any, shape: tuple[int, ...], kshape: tuple[int, ...], dtype: Any) -> Callable[[Any], Any]:
    """Materialise a broadcast operand: a fresh packed array of ``shape`` (the operand broadcast into it,
    converted to ``dtype``), viewed as ``kshape``."""
    empty, copy_, reshape = adapter.empty, adapter.copy_, adapter.reshape

    def expand(x: Any) -> Any:
        buf = empty(shape, dtype, x)
        copy_(buf, x)
        return reshape(buf, kshape)

    return expand


def _memoised(adapter: Any, convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` (a mask's conversion to the packed kernel operand) that reuses its last result while it
    is given the same array object with the same :meth:`~tracea.runtime.arrays.ArrayAdapter.version`
    (no in-place write since), so a mask shared by every layer of a model is converted once per forward,
    not once per layer. One entry per plan; it holds the converted array only while the source array
    lives (a weak reference drops it). Never reused under a CUDA graph capture (the capture records the
    conversion, so each replay converts the mask's contents of that time) nor for arrays without a
    version (NumPy, torch inference tensors)."""
    version, capturing = adapter.version, adapter.capturing
    memo: list[Any] = [None]  # (weak ref to the source, its version, the converted array)

    def drop(ref: Any) -> None:
        entry = memo[0]
        if entry is not None and entry[0] is ref:
            memo[0] = None

    def convert_once(x: Any) -> Any:
        ver = version(x)
        if ver is None or capturing(x):
            return convert(x)
        entry = memo[0]
        if entry is not None and entry[0]() is x and entry[1] == ver:
            return entry[2]
        converted = convert(x)
        try:
            ref = weakref.ref(x, drop)
        except TypeError:  # not weakly referenceable: nothing is kept
            return converted
        memo[0] = (ref, ver, converted)
        return converted

    return convert_once


def _packed_as(adapter: Any, packed: bool, kshape: tuple[int, ...], same_shape: bool) -> Callable[[Any], Any] | None:
    """How to turn an operand whose shape needs no broadcast into a packed ``kshape`` array."""
    contiguous, reshape = adapter.contiguous, adapter.reshape
    if packed:
        if same_shape:
            return None
        view = lambda x: reshape(x, kshape)  # noqa: E731
        view.is_view = True  # type: ignore[attr-defined]  # pointer-only launchers skip it
        return view
    return lambda x: reshape(contiguous(x), kshape)


def _flag(name: str, value: Any) -> bool:
    """A bool argument: Python or NumPy bools, or the integers 0 and 1."""
    if not isinstance(value, (bool, np.bool_, numbers.Integral)) or value not in (0, 1):
        raise InvalidArgumentError(name, value, "True or False")
    return bool(value)


def _structured(adapter: Any, attn_mask: Any, causal: bool, sq: int, sk: int, Q: Any) -> tuple[Any, bool]:
    """``(attn_mask, causal)`` with a mask object that describes a causal mask (torch's ``CausalBias``,
    :meth:`~tracea.runtime.arrays.ArrayAdapter.structured_mask`) replaced: upper-left alignment is
    ``is_causal`` (the kernels' own masking); lower-right alignment (where seq_q != seq_kv) a boolean mask
    built once per call. Plain arrays pass through."""
    found = adapter.structured_mask(attn_mask, Q.obj)
    if found is None:
        return attn_mask, causal
    align, mq, mk, mask = found
    if (mq, mk) != (sq, sk):
        raise ShapeError("attn_mask", attn_mask, f"a causal bias for seq_q {sq} and seq_kv {sk}")
    if align == "upper_left" or sq == sk:
        return None, True
    return mask, causal


@retrying
def attention(key: Any, q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: Any, causal: Any, scale: Any,
              enable_gqa: Any, out: Any, variant: str | None, config: Any, return_lse: Any = False) -> Any:
    """The full path of ``tracea.ops.attention`` (see its docstring for the arguments)."""
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("q", q), ("k", k), ("v", v), ("out", out)])
    Q, K, V = o["q"], o["k"], o["v"]
    for t in (Q, K, V):
        ops_args.check_rank(t, tuple(range(3, 9)), "(..., heads, seq, head_dim)")
    dtype = ops_args.check_float(Q)
    ops_args.same_dtype(Q, K, V)
    causal = _flag("is_causal", causal)
    enable_gqa = _flag("enable_gqa", enable_gqa)
    return_lse = _flag("return_lse", return_lse)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= float(dropout_p) <= 1.0:
        raise InvalidArgumentError("dropout_p", dropout_p, "a probability in [0, 1]")
    *lq, hq, sq, d = Q.info.shape
    *lk, hk, sk, dk = K.info.shape
    *lv, hv, sv, dv = V.info.shape
    if dk != d:
        raise ShapeError("k", k, f"head_dim {d} like q (shape (..., kv_heads, seq_kv, {d}))")
    if (hv, sv) != (hk, sk):
        raise ShapeError("v", v, f"kv_heads {hk} and seq_kv {sk} like k (shape (..., {hk}, {sk}, head_dim_v))")
    lead = _broadcast("k", k, [tuple(lq), tuple(lk), tuple(lv)])
    heads = hq
    if hq == 1 and hk > 1 and not enable_gqa:  # q broadcasts over the kv heads (PyTorch's matmul rules)
        heads = hk
    if heads % hk:
        raise ShapeError("k", k, f"kv heads dividing q's {hq} heads (grouped-query attention)")
    batch = math.prod(lead)

    mask_kind = mask_shape = None
    prep_mask = None
    given_mask = attn_mask
    if attn_mask is not None:
        attn_mask, causal = _structured(adapter, attn_mask, causal, sq, sk, Q)
    if attn_mask is not None:
        if not adapter.owns(attn_mask):
            raise InvalidArgumentError("attn_mask", attn_mask, f"a {adapter.name} array like q")
        mshape = tuple(int(s) for s in getattr(attn_mask, "shape", ()))
        if is_bool_array(attn_mask):
            mask_kind = "bool"
        else:
            info = adapter.info(attn_mask)
            if info.dtype not in ops_args.FLOATS:
                raise DTypeError("attn_mask.dtype", info.dtype.value, "bool or a floating dtype (additive)")
            if info.device != Q.info.device:
                raise InvalidArgumentError("attn_mask", attn_mask, f"an array on {Q.info.device} like q")
            mask_kind = "additive"
        full = tuple(lead) + (heads, sq, sk)
        if len(mshape) > len(full) or any(m not in (1, f) for m, f in zip(mshape[::-1], full[::-1])):
            raise ShapeError("attn_mask", attn_mask, f"a shape that broadcasts to {full}")
        padded = (1,) * (len(full) - len(mshape)) + mshape
        mb = batch if any(s != 1 for s in padded[:-3]) else 1
        mh = heads if padded[-3] != 1 else 1
        mask_shape = (mb, mh)
        target = (tuple(lead) if mb > 1 else (1,) * len(lead)) + (mh, sq, sk)
        kmask = (mb, mh, sq, sk)
        if mask_kind == "additive" and info.dtype is dtype and info.c_contiguous and padded == target:
            prep_mask = _packed_as(adapter, True, kmask, mshape == kmask)
        else:  # broadcast over seq_q, another dtype (bool) or strided: converted, once per mask version
            prep_mask = _memoised(adapter, _expanded(adapter, target, kmask, dtype))

    out_shape = tuple(lead) + (heads, sq, dv)
    kshape = (batch, heads, sq, dv)
    U = o.get("out")
    ops_args.check_out(U, out_shape, dtype)
    ops_args.check_no_overlap(U, [Q, K, V])
    direct_out = U is not None and U.info.c_contiguous

    def prep(t: ops_args.Operand, lead_t: list[int], h: int, s: int, e: int) -> Callable[[Any], Any] | None:
        kshape_t = (batch, h, s, e)
        if tuple(lead_t) == tuple(lead) and t.info.shape[-3] == h:
            return _packed_as(adapter, t.info.c_contiguous, kshape_t, tuple(t.info.shape) == kshape_t)
        return _expanded(adapter, tuple(lead) + (h, s, e), kshape_t, dtype)

    def layout(t: ops_args.Operand, lead_t: list[int], h: int, s: int, e: int) -> strided.Triple | None:
        """The strides a variant that takes strided operands reads ``t`` with, when ``t`` is served as it is
        (not packed, but its leading dims fold into one batch: see :mod:`tracea.runtime.attention_strides`)."""
        if tuple(lead_t) != tuple(lead) or t.info.shape[-3] != h or t.info.c_contiguous:
            return None
        return strided.fold(t.info.shape, t.info.strides)

    dims = ((Q, lq, heads, sq, d), (K, lk, hk, sk, d), (V, lv, hk, sk, dv))
    preps = tuple(prep(*a) for a in dims) + (prep_mask,)
    layouts = [layout(*a) for a in dims]
    op_strides = None
    bshd_out = False
    if any(t is not None for t in layouts):  # served as they are by variants that take strides
        bshd_out = not direct_out and strided.bshd_like(layouts[0])
        outs = (sq * heads * dv if batch > 1 else 0, dv if heads > 1 else 0, heads * dv if sq > 1 else 0) \
            if bshd_out else strided.packed(heads, sq, dv, batch)
        op_strides = tuple(x for t, (_, _, h, s, e) in zip(layouts, dims)
                           for x in (t if t is not None else strided.packed(h, s, e, batch))) + outs
    op = AttentionOp(batch, heads, sq, sk, d, causal=causal, scale=scale, kv_heads=hk, dtype=dtype,
                     mask=mask_kind, mask_shape=mask_shape, dropout_p=float(dropout_p), head_dim_v=dv, lse=return_lse,
                     strides=op_strides)
    raw_preps = tuple(None if t is not None else p for t, p in zip(layouts, preps[:3])) + preps[3:]
    packed_new_out = adapter.empty_factory(out_shape, dtype, q)
    if bshd_out:  # q's storage order, (..., seq, heads, dv), viewed as (..., heads, seq, dv) like PyTorch's
        n = len(lead)
        bshd_alloc = adapter.empty_factory(tuple(lead) + (sq, heads, dv), dtype, q)
        axes = tuple(range(n)) + (n + 1, n, n + 2)
        permute = adapter.permute
        new_out: Callable[[Any], Any] = lambda x: permute(bshd_alloc(x), axes)  # noqa: E731
    else:
        new_out = packed_new_out
    reshape, copy_ = adapter.reshape, adapter.copy_
    check_out = _out_checks(U, [Q, K, V])
    view_out = out_shape != kshape

    def kernel_args(ps: tuple, view: bool, qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> tuple:
        pq, pk, pv, pm = ps
        inputs = (qq if pq is None else pq(qq), kk if pk is None else pk(kk), vv if pv is None else pv(vv),
                  mm if (mm is None or pm is None) else pm(mm))
        target = user_out if direct_out else new_out(qq)
        return inputs, target, (reshape(target, kshape) if view else target)

    inputs0, target0, kout0 = kernel_args(raw_preps, view_out, q, k, v, attn_mask, out)
    user0 = {"q": q, "k": k, "v": v, "mask": attn_mask}
    if return_lse:  # float32 (..., heads, seq_q), fresh per call; the kernel sees (batch, heads, seq_q)
        new_lse, lse_kshape = adapter.empty_factory(tuple(lead) + (heads, sq), DType.F32, q), (batch, heads, sq)
        lse0 = new_lse(q)
        inputs0 = inputs0 + (reshape(lse0, lse_kshape),)
    run, result0 = dispatch.runner(op, device, adapter, user0, kout0, variant=variant, config=config, doctor=doctor,
                                   inputs=inputs0)
    launch = run.launch
    if op_strides is not None and launch is not None:
        if run.decision is not None and run.decision.chosen.variant.takes_strides(run.decision.op):
            preps = raw_preps  # the strided operands as they are (pointer launchers: no views either)
        elif bshd_out:  # a packed output, no copy through a packed temporary; the first call's too (its
            new_out = packed_new_out  # kernel has not run yet), so every call returns the same layout
            target0 = new_out(q)
            kout0 = reshape(target0, kshape) if view_out else target0
    if return_lse:
        if launch is None:
            raise NoVariantError(f"return_lse: no Tracea kernel serves {op.describe()} ({run.reason}); the framework "
                                 "fallback does not give the log-sum-exp")
        return _finish(key, *_lse_plan(run, lse0, new_lse, lse_kshape, preps, kernel_args, view_out, check_out,
                                       adapter, inputs0, target0, kout0, out))

    direct = None
    if launch is None and U is None and attn_mask is given_mask:  # (not a mask object read for what it stands for)
        direct = adapter.direct_attention(op, q, k, v, attn_mask)
    if direct is not None:  # the framework's own call, nothing rebuilt (the first call was counted by the runner)
        cell = fallbacks.counter(op.kind.value, run.reason or "")

        def plan(qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> Any:
            cell[0] += 1
            return direct(qq, kk, vv, mm)

        def first_call() -> Any:
            return result0
    elif launch is None:  # a framework computes every call of this signature (PyTorch, on the user's arrays)
        def plan(qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> Any:
            if check_out is not None:
                check_out(user_out, qq, kk, vv)
            target = user_out if direct_out else new_out(qq)
            kout = reshape(target, kshape) if view_out else target
            result = dispatch.fallback(run, {"q": qq, "k": kk, "v": vv, "mask": mm}, kout)
            return _deliver(result, kout, target, user_out, copy_)

        def first_call() -> Any:
            return _deliver(result0, kout0, target0, out, copy_)
    else:
        lean = getattr(launch, "pointer_only", False)
        lean_preps = tuple(None if (p is not None and lean and getattr(p, "is_view", False)) else p for p in preps)
        lean_view = view_out and not lean
        if U is None and all(p is None for p in lean_preps[:3]) and attn_mask is None:
            # the common case in one frame: packed q, k, v, no mask, no out= (all fixed by the signature)
            def plan(qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> Any:
                target = new_out(qq)
                launch(qq, kk, vv, None, target)
                return target
        else:
            def plan(qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> Any:
                if check_out is not None:
                    check_out(user_out, qq, kk, vv)
                inputs, target, kout = kernel_args(lean_preps, lean_view, qq, kk, vv, mm, user_out)
                launch(*inputs, kout)
                if user_out is None:
                    return target
                if target is not user_out:
                    copy_(user_out, target)
                return user_out

        def first_call() -> Any:
            launch(*inputs0, kout0)
            if out is None:
                return target0
            if target0 is not out:
                copy_(out, target0)
            return out

    plan.runner = run  # type: ignore[attr-defined]  # for tools and tests: what this plan runs
    return _finish(key, plan, first_call)


def _lse_plan(run: Any, lse0: Any, new_lse: Callable[[Any], Any], lse_kshape: tuple[int, ...], preps: tuple,
              kernel_args: Callable[..., tuple], view_out: bool, check_out: Any, adapter: Any, inputs0: tuple,
              target0: Any, kout0: Any, out0: Any) -> tuple[Callable[..., Any], Callable[[], Any]]:
    """The plan (and its first call) of a ``return_lse`` signature: each call allocates the float32
    log-sum-exp array, launches with it after the mask and returns ``(out, lse)``."""
    launch = run.launch
    lean = getattr(launch, "pointer_only", False)
    lean_preps = tuple(None if (p is not None and lean and getattr(p, "is_view", False)) else p for p in preps)
    lean_view = view_out and not lean
    reshape, copy_ = adapter.reshape, adapter.copy_

    def deliver(target: Any, user_out: Any) -> Any:
        if user_out is None:
            return target
        if target is not user_out:
            copy_(user_out, target)
        return user_out

    def plan(qq: Any, kk: Any, vv: Any, mm: Any, user_out: Any) -> Any:
        if check_out is not None:
            check_out(user_out, qq, kk, vv)
        inputs, target, kout = kernel_args(lean_preps, lean_view, qq, kk, vv, mm, user_out)
        lse = new_lse(qq)
        launch(*inputs, reshape(lse, lse_kshape), kout)
        return deliver(target, user_out), lse

    def first_call() -> Any:
        launch(*inputs0, kout0)
        return deliver(target0, out0), lse0

    plan.runner = run  # type: ignore[attr-defined]  # for tools and tests: what this plan runs
    return plan, first_call
