"""Running cases: :func:`run_case` executes one case in this process and judges it; :func:`serve` is
the loop of a worker process, reading ``{"seed", "index"}`` requests on stdin and answering one JSON
line per case on the protocol stream (the original stdout; the library's own prints go to stderr).

Test hook: ``TRACEA_FUZZ_INJECT="crash@12,hang@40,raise@7"`` makes the case at that index abort the
process (``os.abort()``), sleep forever, or raise a ``RuntimeError`` inside the call, so the harness's
crash, hang and non-Tracea-exception paths can be tested.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

from . import known_issues
from .arrays import FLOAT_DTYPES, Built, array_kind, covered_bytes, device_of, dtype_name, result_f64
from .cases import Case, decode, generate
from .oracle import Verdict, compare
from .recorder import Recorder, backend_of, install

INJECT_ENV = "TRACEA_FUZZ_INJECT"
_recorder: Recorder | None = None


def _inject(index: int) -> None:
    for item in os.environ.get(INJECT_ENV, "").split(","):
        what, _, at = item.partition("@")
        if at.strip() and int(at) == index:
            if what == "crash":
                os.abort()
            if what == "hang":
                while True:
                    time.sleep(3600)
            if what == "raise":
                raise RuntimeError("injected by TRACEA_FUZZ_INJECT")


def call_args(case: Case, built: dict[str, Built]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of the call (arrays by name, other values decoded)."""
    def value(name: str) -> Any:
        if name in built:
            return built[name].obj
        return decode(case.kwargs[name]) if name in case.kwargs else None
    args = [value(n) for n in case.positional]
    kwargs = {n: b.obj for n, b in built.items() if n not in case.positional}
    kwargs.update({k: decode(v) for k, v in case.kwargs.items() if k not in case.positional})
    return args, kwargs


def run_case(seed: int, index: int, device: str = "cpu", tolerate_known: bool | None = None,
             on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Generate, build, run and judge one case; a JSON-ready record with its findings."""
    global _recorder
    import tracea
    from ..errors import TraceaError

    if _recorder is None:
        _recorder = install()
    _recorder.on_event = on_event
    _recorder.take()
    case = generate(seed, index)
    rng = np.random.default_rng([seed, index])
    from .arrays import build_arrays

    built, bufs = build_arrays(case.arrays, rng, device)
    before = bufs.snapshot()
    lists_before = {n: copy.deepcopy(b.obj) for n, b in built.items() if b.kind == "list"}
    args, kwargs = call_args(case, built)
    fn = getattr(tracea.ops, case.op)
    start = time.perf_counter()
    result: Any = None
    error: BaseException | None = None
    try:
        _inject(index)
        result = fn(*args, **kwargs)
        _synchronize(result)
    except Exception as exc:  # noqa: BLE001 - judged below
        error = exc
    seconds = time.perf_counter() - start
    events = _recorder.take()
    verdict = Verdict()
    expect = _device_expect(case, built)
    record: dict[str, Any] = {"seed": seed, "index": index, "op": case.op, "kind": case.kind, "dtype": case.dtype,
                              "expect": expect, "backend": backend_of(events),
                              "variants": [e["variant"] for e in events], "seconds": round(seconds, 4)}
    if error is not None:
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:400]
        if not isinstance(error, TraceaError):
            verdict.add("nontracea", record["error"], "".join(traceback.format_exception(error))[-2000:])
        elif expect == "valid" and not _cupy_without_kernel(error, built):
            verdict.add("refused_valid", record["error"])
    elif expect == "invalid":
        verdict.add("wrong", "accepted a call documented as an error: " + "; ".join(
            n for n in case.notes if n.startswith("invalid")))
    else:
        _check_result(case, built, result, events, device, verdict, known_issues.enabled(tolerate_known))
    _check_memory(case, built, bufs, before, lists_before, error is None, verdict)
    if verdict.ratio is not None:
        record["err_ratio"] = float(f"{verdict.ratio:.3g}")
    record["findings"] = [f.to_dict() for f in verdict.findings]
    record["known"] = sorted(set(verdict.known))
    return record


def _synchronize(result: Any) -> None:
    mod = type(result).__module__.split(".")[0]
    if mod == "torch" and result.device.type == "cuda":
        import torch

        torch.cuda.synchronize(result.device)
    elif mod == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


_HOST_ONLY = ("invalid: read-only out",)  # properties a NumPy array loses when it becomes a CUDA array


def _device_expect(case: Any, built: dict[str, Built]) -> str:
    """The case's expectation for the arrays actually built: on ``--device cuda`` a read-only NumPy
    ``out`` becomes a (writable) CUDA array, so the call is valid there."""
    out = built.get("out")
    if case.expect != "invalid" or out is None or out.kind == "numpy":
        return case.expect
    reasons = [n for n in case.notes if n.startswith("invalid")]
    if reasons and all(r in _HOST_ONLY for r in reasons):
        return "either" if any(n.startswith("either") for n in case.notes) else "valid"
    return case.expect


def _cupy_without_kernel(error: Exception, built: dict[str, Built]) -> bool:
    """CuPy arrays have no framework fallback (docs/fuzzing.md): a valid call no CUDA variant serves
    (float64, float32 attention, ...) is a documented NoVariantError there, not a refused valid call."""
    from ..errors import NoVariantError

    kinds = {b.kind for n, b in built.items() if n != "out" and b.kind not in ("list", "scalar")}
    return isinstance(error, NoVariantError) and kinds == {"cupy"}


def _expected_kind(built: dict[str, Built]) -> str:
    kinds = [b.kind for b in built.values() if b.kind not in ("list", "scalar")]
    return kinds[0] if kinds else "numpy"


def _check_result(case: Case, built: dict[str, Built], result: Any, events: list[dict[str, Any]], device: str,
                  verdict: Verdict, tolerate: bool) -> None:
    from .reference import compute

    values = {n: b.values for n, b in built.items() if b.values is not None}
    ref = compute(case.op, values, case.model)
    kind = array_kind(result)
    want_kind = _expected_kind(built)
    if kind != want_kind:
        verdict.add("wrong", f"result is a {type(result).__module__}.{type(result).__name__}, expected a {want_kind} array")
        return
    out = built.get("out")
    if out is not None and result is not out.obj:
        verdict.add("wrong", "out= was given but the result is another object")
    shape = tuple(getattr(result, "shape", ()))
    if shape != ref.ref.shape:
        verdict.add("wrong", f"result shape {shape}, expected {ref.ref.shape}")
        return
    out_dtype = case.model.get("out_dtype", case.dtype)
    if dtype_name(result) != out_dtype and any(b.kind != "list" for b in built.values()):
        verdict.add("wrong", f"result dtype {dtype_name(result)}, expected {out_dtype}")
    inputs = [b for n, b in built.items() if n != "out" and b.kind in ("numpy", "torch", "cupy")]
    want_dev = device_of(inputs[0].obj) if inputs else "cpu"
    if device_of(result) != want_dev:
        verdict.add("wrong", f"result on {device_of(result)}, inputs on {want_dev}")
    if out is None and any(_shares(result, b.obj) for b in inputs):
        verdict.add("wrong", "the result shares memory with an input")
    got = result_f64(result)
    if np.iscomplexobj(got):
        verdict.add("wrong", "complex result")
        return
    in_dtype = case.dtype if case.dtype in FLOAT_DTYPES else "float64"
    model = dict(case.model, precision=_framework_precision(case, inputs)) if "precision" in case.model else case.model
    ctx = {"op": case.op, "model": model, "out_dtype": out_dtype if out_dtype in FLOAT_DTYPES else "float64",
           "in_dtype": in_dtype, "backend": backend_of(events), "variants": [e["variant"] for e in events],
           "steps": case.model.get("steps", []),
           "nonfinite_inputs": any(b.values is not None and b.values.dtype.kind == "f" and not np.isfinite(b.values).all()
                                   for n, b in built.items() if n != "out"),
           "seq_kv": int(built["k"].values.shape[-2]) if "k" in built and built["k"].values is not None else 0}
    compare(ctx, got, ref, verdict, tolerate)


def _framework_precision(case: Case, inputs: list[Built]) -> str:
    """The float32 precision the call computes at: ``fp32_precision=`` when given (the model's), else what the
    array kind's adapter says its framework computes (torch: ``F.conv2d`` on CUDA at TF32 while
    ``torch.backends.cudnn.allow_tf32``, other products at ``torch.get_float32_matmul_precision()``; see
    :meth:`~tracea.runtime.arrays.ArrayAdapter.conv_fp32_precision`), fp32-accurate where it says nothing."""
    given = case.model.get("precision", "highest")
    if "fp32_precision" in case.kwargs or not inputs:
        return given
    from ..doctor.doctor import get_doctor
    from ..errors import TraceaError
    from ..runtime.arrays import find_adapter

    obj = inputs[0].obj
    try:
        adapter = find_adapter(obj, get_doctor().adapters(), "x")
    except TraceaError:  # an array kind nothing serves: the call is judged on its error, not its values
        return given
    found = adapter.conv_fp32_precision(obj) if case.op == "conv2d" else adapter.fp32_precision()
    return str(found) if found is not None else given


def _shares(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    mod = type(a).__module__.split(".")[0]
    if mod == "torch" and type(b).__module__.split(".")[0] == "torch":
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0
    return False


def _check_memory(case: Case, built: dict[str, Built], bufs: Any, before: dict[str, np.ndarray],
                  lists_before: dict[str, Any], succeeded: bool, verdict: Verdict) -> None:
    """Inputs must be byte-identical; ``out``'s buffer may change only at out's elements (and only
    when the call succeeded, if the buffer is an input's too)."""
    after = bufs.snapshot()
    for root, old in before.items():
        new = after[root]
        changed = old != new
        if not changed.any():
            continue
        users = [b for b in built.values() if b.root == root]
        out_mask = np.zeros(old.size, dtype=bool)
        in_mask = np.zeros(old.size, dtype=bool)
        for b in users:
            m = covered_bytes(b.geo, tuple(b.spec.shape), _item(b), old.size)  # type: ignore[arg-type]
            if b.name == "out":
                out_mask |= m
            else:
                in_mask |= m
        allowed = out_mask & ~in_mask if not succeeded else out_mask
        bad = changed & ~allowed
        if bad.any():
            names = ", ".join(b.name for b in users)
            where = "inside an input" if (bad & in_mask).any() else "outside every array's elements"
            verdict.add("mutated", f"{int(bad.sum())} bytes of the buffer of {names} changed {where}"
                        + ("" if succeeded else " (the call raised)"))
    for name, old in lists_before.items():
        if repr(old) != repr(built[name].obj):
            verdict.add("mutated", f"list argument {name} was modified")


def _item(b: Built) -> int:
    from .arrays import ITEMSIZE

    return ITEMSIZE[b.spec.dtype]


def serve(device: str = "cpu", tolerate_known: bool | None = None) -> int:
    """The worker loop: one JSON request per stdin line, one JSON answer per case on the protocol
    stream (the process's original stdout). Progress events (the variant about to run) precede it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    import tracea  # noqa: F401 - import cost before "ready"

    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("quit"):
            break
        seed, index = int(req["seed"]), int(req["index"])
        send({"start": index})
        try:
            rec = run_case(seed, index, device, tolerate_known, on_event=lambda e: send({"event": e}))
        except Exception as exc:  # noqa: BLE001 - a harness error is reported, not fatal
            rec = {"seed": seed, "index": index, "harness_error": f"{type(exc).__name__}: {exc}",
                   "detail": traceback.format_exc()[-2000:], "findings": [], "known": []}
        send({"result": rec})
    return 0
