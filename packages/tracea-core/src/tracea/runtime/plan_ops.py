"""Plans for the public ops (``tracea.ops.matmul`` / ``conv2d``; ``attention`` in :mod:`.plan_attention`):
the full path of a call.

Each builder validates the arguments of one call, builds the op, decides (:func:`dispatch.runner`),
works out everything the call's signature fixes (which operands need packing or a transposed view, the
output's shape and whether it goes through a temporary) and returns a *plan*: a closure that runs any
call with the same signature doing only per-call work (per-call checks of ``out``, the packing the
layout needs, the output allocation, the launch). The builder stores the plan under the caller's key
(see :mod:`tracea.runtime.plans`) and runs it for this first call.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

from ..doctor.doctor import get_doctor
from ..dtypes import DType, Fp32Precision
from ..errors import InvalidArgumentError, ShapeError
from ..ir.epilogue import Epilogue, EpilogueKind
from ..ir.ops import Conv2dOp, GemmOp, Layout, Op
from . import dispatch, fallbacks, first_use, operands as ops_args, plans

_NONE = object()


def _epilogue(epilogue: Any, activation: Any, has_bias: bool) -> Epilogue:
    epi = Epilogue.parse(epilogue)
    if activation is not None:
        epi = Epilogue(epi.steps + Epilogue.parse(activation, "activation").steps)
    if has_bias and not epi.has_bias:
        epi = Epilogue((EpilogueKind.BIAS,) + epi.steps)
    if epi.has_bias and not has_bias:
        raise InvalidArgumentError("bias", None, "a bias array, since the epilogue has a bias step")
    return epi


def _precision(value: Any, framework: Callable[[], Any]) -> Fp32Precision:
    """``value`` when given, else the framework's own setting (``framework()``), else fp32-accurate."""
    if value is not None:
        return Fp32Precision.parse(value)
    return Fp32Precision.parse(framework() or Fp32Precision.HIGHEST)


def _prep(op: ops_args.Operand) -> Callable[[Any], Any] | None:
    """How to pack this operand on every call with its signature (None: used as it is)."""
    return None if op.info.c_contiguous else op.adapter.contiguous


def _view(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Mark a prep that only builds a view (same memory): pointer-only launchers skip it."""
    def view(x: Any) -> Any:
        return fn(x)

    view.is_view = True  # type: ignore[attr-defined]
    return view


def _unguarded(launch: Any) -> tuple[Callable[..., None], Callable[[Exception], Any]]:
    """(the launch without :func:`dispatch.bind`'s guard frame, the guard's failure handler): a hot plan
    calls the first and hands its exceptions to the second, which raises what the guard would have."""
    raw, failed = getattr(launch, "raw", None), getattr(launch, "failed", None)
    if raw is None or failed is None:
        def reraise(exc: Exception) -> Any:
            raise exc
        return launch, reraise
    return raw, failed


def _lean(prep: Callable[[Any], Any] | None, launch: Any) -> Callable[[Any], Any] | None:
    """``prep``, or None when it only builds a view and the launcher reads data pointers alone."""
    if prep is not None and getattr(prep, "is_view", False) and getattr(launch, "pointer_only", False):
        return None
    return prep


def _prep_maybe_transposed(op: ops_args.Operand) -> tuple[Callable[[Any], Any] | None, bool]:
    """(packing, transposed): a column-major operand is used through its transposed view, no copy."""
    if op.info.c_contiguous:
        return None, False
    if op.info.ndim >= 2 and op.info.strides is not None:
        swapped = op.adapter.swap_last(op.obj)
        if op.adapter.info(swapped).c_contiguous:
            return _view(op.adapter.swap_last), True
    return op.adapter.contiguous, False


def _bias_prep(bias: ops_args.Operand | None, length: int, out_dtype: DType, what: str) -> Callable[[Any], Any] | None:
    """Check the bias vector; return how to convert it to the output dtype and pack it (None: as is)."""
    if bias is None:
        return None
    if bias.info.ndim != 1 or bias.info.shape[0] != length:
        raise ShapeError("bias", bias.obj, f"a 1-D array of length {length} ({what})")
    ops_args.check_float(bias)
    adapter = bias.adapter
    if bias.info.dtype is out_dtype:
        return None if bias.info.c_contiguous else adapter.contiguous
    return lambda x: adapter.contiguous(adapter.astype(x, out_dtype))


def _out_checks(out: ops_args.Operand | None, inputs: list[ops_args.Operand | None]) -> Callable[..., None] | None:
    """Per-call checks of a user ``out`` (writeable, not overlapping an input): its memory can change
    between calls of one signature."""
    if out is None:
        return None
    adapter = out.adapter
    names = [i.name for i in inputs if i is not None]

    def check(out_obj: Any, *arrays: Any) -> None:
        why = adapter.write_error(out_obj)
        if why:
            raise InvalidArgumentError("out", out_obj, "an array Tracea may write into", hint=why)
        for name, arr in zip(names, arrays):
            if adapter.may_overlap(out_obj, arr):
                raise InvalidArgumentError("out", out_obj, f"an array that does not overlap input '{name}'")

    return check


def _finish(key: Any, plan: Callable[..., Any], first: Callable[[], Any]) -> Any:
    """Store ``plan`` under ``key`` (when the call is cacheable) and run the first call."""
    if key is not None:
        plans.store(key, plan)
    return first()


def framework_check(adapter: Any, direct: Callable[..., Any] | None, free: bool, like: Any) -> bool:
    """Whether first-use tuning's framework check (:func:`framework_judged`) will time this signature's choice
    against ``direct``, the framework's own call: the first-use policy, a free choice, a direct call, and not
    inside a CUDA graph capture (nothing can be timed there). The Doctor then also keeps variants that
    declined only because the framework measured faster (:class:`~tracea.doctor.decision.FrameworkFaster`):
    the check decides on the call's own arrays."""
    return (direct is not None and free and first_use.tuning_mode() == "first-use"
            and not adapter.capturing(like))


def framework_judged(run: dispatch.Runner, adapter: Any, direct: Callable[..., Any] | None, checked: bool,
                     plan: Callable[..., Any], first_call: Callable[[], Any], first: tuple
                     ) -> tuple[Callable[..., Any], Callable[[], Any]]:
    """First-use tuning's framework check (``checked``: :func:`framework_check` said it runs for this signature):
    a Tracea kernel and the framework's own call for these arrays (``direct(x, y, z)``,
    :meth:`ArrayAdapter.direct_fallback`) timed by the adapter on the first call's arrays (``first``), and the
    faster serves the signature (see :meth:`ArrayAdapter.arbitrate`): ``(plan, first_call)`` as given, or the
    framework's, counted as a fallback with the verdict's reason. Where the verdict names another winner for
    calls captured in CUDA graphs, the plan asks on each call whether its stream is capturing. A variant the
    Doctor kept only for this check (``Candidate.framework_faster``) gives way to the framework when the
    adapter has no verdict. Calls with ``out=`` keep Tracea's plan (``direct`` is None for them)."""
    if run.launch is None or not checked:
        return plan, first_call
    assert direct is not None
    x0, y0, z0 = first
    verdict = adapter.arbitrate(run.decision, lambda x, y, z: plan(x, y, z, None), direct, (x0, y0, z0))
    kept = run.decision.chosen.framework_faster if run.decision is not None else ""
    if verdict is None:
        if not kept:
            return plan, first_call
        verdict = ("framework", f"{run.decision.variant.name}: {kept}")  # type: ignore[union-attr]
    eager, reason = verdict[0], verdict[1]
    captured = verdict[2] if len(verdict) > 2 else eager
    if eager != "framework" and captured != "framework":
        return plan, first_call
    kind = run.op.kind.value
    theirs = _counted(direct, kind, reason)
    sides = {"framework": theirs, "tracea": plan}
    routed = _by_capture(sides[eager], sides[captured], adapter.capturing)
    if eager != "framework":
        routed.runner = run  # type: ignore[attr-defined]
        return routed, first_call
    fallbacks.record(kind, reason)  # the first call (and the warn-once)
    routed.runner = dispatch.Runner(run.op, run.decision, None, reason)  # type: ignore[attr-defined]
    return routed, lambda: direct(x0, y0, z0)


def _by_capture(eager: Callable[..., Any], captured: Callable[..., Any],
                capturing: Callable[[Any], bool]) -> Callable[..., Any]:
    """``eager`` itself when both sides are one plan, else a plan calling ``captured`` while ``x``'s stream
    is capturing a CUDA graph and ``eager`` otherwise."""
    if eager is captured:
        return eager

    def routed(x: Any, y: Any, z: Any, user_out: Any) -> Any:
        return (captured if capturing(x) else eager)(x, y, z, user_out)

    return routed


def _counted(direct: Callable[..., Any], kind: str, reason: str) -> Callable[..., Any]:
    """A plan calling the framework's ``direct(x, y, z)`` and bumping the fallback counter cell of (``kind``,
    ``reason``) (no lock, no call: a fallback's hot path; the first call is counted with
    :func:`fallbacks.record`, which also warns once)."""
    cell = fallbacks.counter(kind, reason)

    def plan(x: Any, y: Any, z: Any, user_out: Any) -> Any:
        cell[0] += 1
        return direct(x, y, z)

    return plan


def retrying(build: Callable[..., Any]) -> Callable[..., Any]:
    """Run a builder again when the variant it chose failed at run time and was quarantined
    (:class:`dispatch.Quarantined`): the Doctor then picks the next candidate. Bounded: a variant is
    quarantined at most once per op, and the reference oracle does not fail."""
    def run(*args: Any) -> Any:
        for _ in range(8):
            try:
                return build(*args)
            except dispatch.Quarantined:
                continue
        return build(*args)

    run.__doc__, run.__name__ = build.__doc__, build.__name__
    return run


# ------------------------------------------------------------------------------------------------
# matmul
# ------------------------------------------------------------------------------------------------

@retrying
def matmul(key: Any, a: Any, b: Any, bias: Any, epilogue: Any, activation: Any, out: Any, out_dtype: Any,
           fp32_precision: Any, variant: str | None, config: Any) -> Any:
    """The full path of ``tracea.ops.matmul`` (see its docstring for the arguments)."""
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("a", a), ("b", b), ("bias", bias), ("out", out)])
    A, B = o["a"], o["b"]
    ops_args.check_rank(A, (2, 3), "(m, k) or (batch, m, k)")
    ops_args.check_rank(B, (2, 3), "(k, n) or (batch, k, n)")
    ops_args.check_float(A)
    ops_args.same_dtype(A, B)
    *ba, m, k = A.info.shape
    *bb, k2, n = B.info.shape
    if k2 != k:
        raise ShapeError("b", b, f"shape ({'batch, ' if bb else ''}{k}, n) to match a's k={k}")
    if ba and bb and ba != bb:
        raise ShapeError("b", b, f"batch {ba[0]} like a")
    if bb and not ba:
        raise ShapeError("a", a, f"a 3-D (batch={bb[0]}, m, k) array when b is 3-D (broadcast a explicitly)")
    batch = ba[0] if ba else 1
    dtype_out = ops_args.check_out_dtype(DType.parse(out_dtype, "out_dtype")) if out_dtype is not None else (
        o["out"].info.dtype if "out" in o else A.info.dtype)
    out_shape = (batch, m, n) if ba else (m, n)
    U = o.get("out")
    ops_args.check_out(U, out_shape, dtype_out)
    ops_args.check_no_overlap(U, [A, B, o.get("bias")])
    epi = _epilogue(epilogue, activation, "bias" in o)
    prep_bias = _bias_prep(o.get("bias"), n, dtype_out, "one value per output column")

    prep_a, ta = _prep_maybe_transposed(A)
    prep_b, tb = _prep_maybe_transposed(B)
    gemm_m, gemm_batch = m, batch
    if ba and not bb:  # (batch, m, k) @ (k, n) is one GEMM with M = batch*m
        if ta:
            prep_a, ta = adapter.contiguous, False
        inner, shape2 = prep_a, (batch * m, k)
        prep_a = (lambda x: adapter.reshape(inner(x), shape2)) if inner else _view(lambda x: adapter.reshape(x, shape2))
        gemm_m, gemm_batch = batch * m, 1
    op = GemmOp(gemm_m, n, k, gemm_batch, trans_a=ta, trans_b=tb, dtype_a=A.info.dtype, dtype_b=B.info.dtype,
                dtype_out=dtype_out, epilogue=epi, fp32_precision=_precision(fp32_precision, adapter.fp32_precision))
    kshape = (gemm_batch, gemm_m, n) if gemm_batch > 1 else (gemm_m, n)
    return _packed_out_plan(key, op, device, adapter, (prep_a, prep_b, prep_bias), ("a", "b", "bias"),
                                 U, out_shape, kshape, dtype_out, [A, B, o.get("bias")], variant, config,
                                 (a, b, bias, out))


def _packed_out_plan(key: Any, op: Op, device: Any, adapter: Any, preps: tuple, roles: tuple[str, ...],
                          U: ops_args.Operand | None, out_shape: tuple[int, ...], kshape: tuple[int, ...],
                          dtype_out: DType, inputs: list, variant: Any, config: Any, first: tuple) -> Any:
    """The plan of an op whose kernel output is the user's output in row-major order, viewed as
    ``kshape`` (GEMM, attention): written in place when ``out`` is packed, else through a temporary."""
    doctor = get_doctor()
    x0, y0, z0, out0 = first
    reshape, copy_ = adapter.reshape, adapter.copy_
    new_out = adapter.empty_factory(out_shape, dtype_out, x0)
    direct_out = U is not None and U.info.c_contiguous
    check_out = _out_checks(U, inputs)

    def arg_builder(pa: Any, pb: Any, pc: Any, view: bool) -> Callable[..., tuple[tuple, Any, Any]]:
        def kernel_args(x: Any, y: Any, z: Any, user_out: Any) -> tuple[tuple, Any, Any]:
            inputs_ = (x if pa is None else pa(x), y if pb is None else pb(y),
                       z if (z is None or pc is None) else pc(z))
            target = user_out if direct_out else new_out(x)
            return inputs_, target, (reshape(target, kshape) if view else target)
        return kernel_args

    inputs0, target0, kout0 = arg_builder(*preps, tuple(kshape) != tuple(out_shape))(x0, y0, z0, out0)  # type: ignore[call-arg]
    user0 = dict(zip(roles, (x0, y0, inputs0[2] if roles[2] == "bias" else z0)))
    direct = None
    if U is None and preps[2] is None and dtype_out is inputs[0].info.dtype:
        direct = adapter.direct_fallback(op, x0)  # the framework's own call (first-use's framework check)
    checked = framework_check(adapter, direct, variant is None and config is None, x0)
    run, result0 = dispatch.runner(op, device, adapter, user0, kout0, variant=variant, config=config, doctor=doctor,
                                   inputs=inputs0, framework_check=checked)
    launch = run.launch
    lean = launch is not None and getattr(launch, "pointer_only", False)
    kernel_args = arg_builder(*(_lean(p, launch) for p in preps), tuple(kshape) != tuple(out_shape) and not lean)  # type: ignore[arg-type,call-arg]

    if launch is None:  # a framework computes every call of this signature
        def plan(x: Any, y: Any, z: Any, user_out: Any) -> Any:
            if check_out is not None:
                check_out(user_out, x, y, z)
            inputs_, target, kout = kernel_args(x, y, z, user_out)
            result = dispatch.fallback(run, dict(zip(roles, (x, y, inputs_[2] if roles[2] == "bias" else z))), kout)
            return _deliver(result, kout, target, user_out, copy_)

        def first_call() -> Any:
            return _deliver(result0, kout0, target0, out0, copy_)
    elif lean and U is None and all(p is None for p in (_lean(q, launch) for q in preps)):
        # the common case in one frame: packed (or pointer-only) operands and no out= (the signature
        # includes out, so this plan only ever sees out=None)
        raw, failed = _unguarded(launch)

        def plan(x: Any, y: Any, z: Any, user_out: Any) -> Any:
            target = new_out(x)
            try:
                raw(x, y, z, target)
            except Exception as exc:  # noqa: BLE001 - failed() raises what the guarded launch would
                failed(exc)
            return target

        def first_call() -> Any:
            return plan(x0, y0, z0, out0)
    else:
        def plan(x: Any, y: Any, z: Any, user_out: Any) -> Any:
            if check_out is not None:
                check_out(user_out, x, y, z)
            inputs_, target, kout = kernel_args(x, y, z, user_out)
            launch(*inputs_, kout)
            if user_out is None:
                return target
            if target is not user_out:
                copy_(user_out, target)
            return user_out

        def first_call() -> Any:
            return plan(x0, y0, z0, out0)

    plan.runner = run  # type: ignore[attr-defined]  # for tools and tests: what this plan runs
    plan, first_call = framework_judged(run, adapter, direct, checked, plan, first_call, (x0, y0, z0))
    return _finish(key, plan, first_call)


def _deliver(result: Any, kout: Any, target: Any, user_out: Any, copy_: Callable[[Any, Any], None]) -> Any:
    """The result of a fallback: its own array, or copied into the user's ``out``."""
    if result is kout:
        result = target
    if user_out is None:
        return result
    if result is not user_out:
        copy_(user_out, result)
    return user_out


# ------------------------------------------------------------------------------------------------
# conv2d
# ------------------------------------------------------------------------------------------------

def _is_channels_last(op: ops_args.Operand) -> bool:
    st, (_, c, h, w) = op.info.strides, op.info.shape
    if st is None or c == 1 or op.info.c_contiguous:
        return False
    return st[1] == 1 and (h == 1 or st[2] == w * c) and (w == 1 or st[3] == c)


def _lean_conv(launch: Any, adapter: Any, X: ops_args.Operand, W: ops_args.Operand, lay: Layout, logical: bool,
               prep_x: Any, prep_w: Any, prep_b: Any, U: Any, op: Conv2dOp, dtype_out: DType,
               x: Any) -> Callable[[Any], Any] | None:
    """The output allocator of a conv plan that passes the caller's arrays straight to a pointer-only
    launcher (None when the call needs views, copies, a bias conversion or ``out=``): NCHW with packed x
    and w, or logically-NCHW arrays (torch) whose x and w are channels_last, with an adapter that can
    allocate a channels_last output (:meth:`~tracea.runtime.arrays.ArrayAdapter.channels_last_factory`)."""
    if launch is None or not getattr(launch, "pointer_only", False) or U is not None or prep_b is not None:
        return None
    if not logical or lay is Layout.NCHW:
        return adapter.empty_factory(op.out_shape, dtype_out, x) if prep_x is None and prep_w is None else None
    x_packed = adapter.info(adapter.permute(X.obj, (0, 2, 3, 1))).c_contiguous
    w_packed = adapter.info(adapter.permute(W.obj, (0, 2, 3, 1))).c_contiguous
    if not (x_packed and w_packed):
        return None
    return adapter.channels_last_factory((op.n, op.k, op.p, op.q), dtype_out, x)


@retrying
def conv2d(key: Any, x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: Any,
           layout: Any, epilogue: Any, activation: Any, out: Any, out_dtype: Any, fp32_precision: Any,
           variant: str | None, config: Any) -> Any:
    """The full path of ``tracea.ops.conv2d`` (see its docstring for the arguments)."""
    doctor = get_doctor()
    adapter, device, o = ops_args.operands(doctor, [("x", x), ("w", w), ("b", b), ("out", out)])
    X, W = o["x"], o["w"]
    ops_args.check_rank(X, (4,), "(N, C, H, W) or (N, H, W, C)")
    ops_args.check_rank(W, (4,), "(K, C/groups, R, S) or (K, R, S, C/groups)")
    ops_args.check_float(X)
    ops_args.same_dtype(X, W)
    logical = bool(getattr(adapter, "logical_nchw", False))
    permute, contiguous = adapter.permute, adapter.contiguous
    if logical:
        if layout is not None and Layout.parse(layout) is Layout.NHWC:
            raise InvalidArgumentError("layout", layout, "None for torch tensors (use channels_last memory)")
        lay = Layout.NHWC if _is_channels_last(X) else Layout.NCHW
        if lay is Layout.NCHW:
            prep_x, prep_w = _prep(X), _prep(W)
        else:
            x_view = permute(X.obj, (0, 2, 3, 1))
            packed_view = adapter.info(x_view).c_contiguous
            prep_x = (lambda t: permute(t, (0, 2, 3, 1))) if packed_view else (
                lambda t: contiguous(permute(t, (0, 2, 3, 1))))
            prep_w = lambda t: contiguous(permute(t, (0, 2, 3, 1)))  # noqa: E731
        n, c, h, wd = X.info.shape
        k, cg, r, s = W.info.shape
    else:
        lay = Layout.parse(layout or "NCHW")
        prep_x, prep_w = _prep(X), _prep(W)
        if lay is Layout.NCHW:
            n, c, h, wd = X.info.shape
            k, cg, r, s = W.info.shape
        else:
            n, h, wd, c = X.info.shape
            k, r, s, cg = W.info.shape
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups <= 0:  # NumPy ints too
        raise InvalidArgumentError("groups", groups, "a positive integer")
    groups = int(groups)
    if cg * groups != c:
        raise ShapeError("w", w, f"C/groups = {c}/{groups} input channels per group (got {cg})")
    dtype_out = ops_args.check_out_dtype(DType.parse(out_dtype, "out_dtype")) if out_dtype is not None else (
        o["out"].info.dtype if "out" in o else X.info.dtype)
    op = Conv2dOp(n, c, h, wd, k, r, s, stride=ops_args.pair("stride", stride),
                  padding=ops_args.pair("padding", padding), dilation=ops_args.pair("dilation", dilation),
                  groups=groups, layout=lay, dtype=X.info.dtype, dtype_out=dtype_out,
                  epilogue=_epilogue(epilogue, activation, "b" in o),
                  fp32_precision=_precision(fp32_precision, lambda: adapter.conv_fp32_precision(x)))
    user_shape = (n, k, op.p, op.q) if (logical or lay is Layout.NCHW) else op.out_shape
    U = o.get("out")
    ops_args.check_out(U, user_shape, dtype_out)
    ops_args.check_no_overlap(U, [X, W, o.get("b")])
    prep_b = _bias_prep(o.get("b"), k, dtype_out, "one value per output channel")
    check_out = _out_checks(U, [X, W, o.get("b")])
    copy_ = adapter.copy_
    new_out = adapter.empty_factory(op.out_shape, dtype_out, x)
    to_logical = logical and lay is Layout.NHWC

    def kernel_args(xx: Any, ww: Any, bb: Any) -> tuple[tuple, Any]:
        return ((xx if prep_x is None else prep_x(xx), ww if prep_w is None else prep_w(ww),
                 bb if (bb is None or prep_b is None) else prep_b(bb)), new_out(xx))

    inputs0, phys0 = kernel_args(x, w, b)
    direct = None
    if (U is None and prep_b is None and dtype_out is X.info.dtype
            and (op.epilogue.steps[:1] == (EpilogueKind.BIAS,)) == ("b" in o)):
        direct = adapter.direct_fallback(op, x)  # the framework's own call, e.g. F.conv2d on CUDA tensors
    checked = framework_check(adapter, direct, variant is None and config is None, x)
    run, result0 = dispatch.runner(op, device, adapter, {"x": x, "w": w, "bias": inputs0[2]}, phys0,
                                   variant=variant, config=config, doctor=doctor, inputs=inputs0,
                                   framework_check=checked)
    launch = run.launch
    lean = _lean_conv(launch, adapter, X, W, lay, logical, prep_x, prep_w, prep_b, U, op, dtype_out, x)

    def deliver(result: Any, phys: Any, user_out: Any) -> Any:
        if result is phys:
            result = permute(phys, (0, 3, 1, 2)) if to_logical else phys
        if user_out is None:
            return result
        if result is not user_out:
            copy_(user_out, result)
        return user_out

    if direct is not None and launch is None:
        # the first call was counted, and warned about, by the runner's fallback above
        plan = _counted(direct, op.kind.value, run.reason or "")

        def first_call() -> Any:
            return deliver(result0, phys0, out)
    elif launch is None:
        def plan(xx: Any, ww: Any, bb: Any, user_out: Any) -> Any:
            if check_out is not None:
                check_out(user_out, xx, ww, bb)
            inputs_, phys = kernel_args(xx, ww, bb)
            return deliver(dispatch.fallback(run, {"x": xx, "w": ww, "bias": inputs_[2]}, phys), phys, user_out)

        def first_call() -> Any:
            return deliver(result0, phys0, out)
    elif lean is not None:
        # the common case in one frame: a pointer-only launcher on arrays whose memory the kernel reads as
        # they are (NCHW packed, or torch channels_last x and w for the NHWC kernels), no out=, a bias of
        # the output dtype: no views built, the output allocated in its final layout
        raw, failed = _unguarded(launch)

        def plan(xx: Any, ww: Any, bb: Any, user_out: Any) -> Any:
            target = lean(xx)
            try:
                raw(xx, ww, bb, target)
            except Exception as exc:  # noqa: BLE001 - failed() raises what the guarded launch would
                failed(exc)
            return target

        def first_call() -> Any:
            launch(*inputs0, phys0)
            return deliver(phys0, phys0, out)
    else:
        def plan(xx: Any, ww: Any, bb: Any, user_out: Any) -> Any:
            if check_out is not None:
                check_out(user_out, xx, ww, bb)
            inputs_, phys = kernel_args(xx, ww, bb)
            launch(*inputs_, phys)
            return deliver(phys, phys, user_out)

        def first_call() -> Any:
            launch(*inputs0, phys0)
            return deliver(phys0, phys0, out)

    plan.runner = run  # type: ignore[attr-defined]
    plan, first_call = framework_judged(run, adapter, direct, checked, plan, first_call, (x, w, b))
    return _finish(key, plan, first_call)
