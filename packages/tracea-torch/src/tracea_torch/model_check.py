"""The model check: a patched model is never slower than the same model unpatched, judged on its own calls.

The arbiter (:mod:`tracea_torch.arbiter`) judges each layer alone, against PyTorch's kernel for the same call.
A cost that lands *between* the layers escapes it: a slower torch op right after a Tracea kernel (the CPU's
shared thread pool, caches, AMX state), a patched layer's Python frames, the copies a layout change makes.
So a model patched at model scope (:func:`tracea_torch.patched`, ``patch_conv2d(model)``, ``patch_linear(model)``,
``patch_attention(model)``; on by default with the arbiter) is also judged as a whole, per call signature (the
shapes, dtypes and devices of the tensors it is called with, the other arguments' values or types):

* its first call runs patched (the layers' own verdicts, first-use tuning and compilation happen there) and its
  second unpatched ("eager": every patched layer computes as PyTorch's module would), both untimed;
* the next :data:`ROUNDS` x 2 calls alternate between the two (patched, eager, eager, patched, ...), each timed
  (on CUDA between two device synchronisations);
* then the faster route serves that signature from then on: the eager route when the patched calls' median
  exceeds the eager calls' by more than :data:`TIE`, else the patched one. A verdict whose margin is within the
  noise of its own samples (the spread ``max / min - 1`` of either side, a busy host's stalls) is not settled
  yet: up to :data:`EXTRA` more rounds of ``ROUNDS`` x 2 calls are timed, and the medians of all decide. A
  model whose calls are short gets rounds until its timed calls add up to :data:`MIN_TIMED_S` (at most
  :data:`MAX_SAMPLES` a side): a few early 20-us calls of a one-layer model are mostly warm-up stalls.

Nothing runs twice: the judged calls are the user's own calls, each computed once by one of the two routes
(which agree to the arbiter's tolerance), so a model with state (a KV cache, running statistics) sees exactly
the calls it was given. Calls made with gradients enabled, while a CUDA stream is capturing (also after an
unpatched verdict: the layers route captured calls by their own verdicts), under ``torch.compile`` /
``torch.export`` / tracing, or after :data:`MAX_SIGNATURES` signatures are run patched without being judged.
``TRACEA_MODEL_CHECK=0`` (or ``TRACEA_ARBITER=0``) turns the check off. Verdicts are kept per model object for
the life of the process (:func:`verdicts`, :func:`tracea_torch.fallbacks.report`); a model routed to PyTorch is
also counted once in :mod:`tracea_torch.fallbacks` under kind ``"model"``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tracea.runtime import env_watch
from tracea.runtime.fallbacks import record

from .adapter import stream_capturing
from .arbiter import enabled as _arbiter_enabled

ENV = "TRACEA_MODEL_CHECK"
#: timed calls of each route before a signature's verdict
ROUNDS = 3
#: further rounds of ``ROUNDS`` x 2 timed calls while a verdict's margin is within its samples' spread
EXTRA = 2
#: ... and while the timed calls of both sides add up to less than this (a model whose calls take microseconds)
MIN_TIMED_S = 2e-3
#: timed calls a side at most
MAX_SAMPLES = 60
#: the patched route keeps a signature unless its median call took more than ``1 + TIE`` times the eager one's
TIE = 0.02
#: signatures judged per model; later ones run patched unjudged (a decode loop whose mask grows every step)
MAX_SIGNATURES = 64
#: the order of a signature's calls: "P" patched, "E" eager; the first two are untimed warm-ups
_ORDER = "PE" + "PEEP" * ((MAX_SAMPLES + 1) // 2)

_EAGER = [0]  # threads inside an eager-routed forward: the layers' fast test (see eager_route)


class _Local(threading.local):
    eager = False  # (a class default: reading a missing attribute of a local raises first, ~0.4 us)


_tls = _Local()
_capturing = stream_capturing()
_verdicts: list["ModelVerdict"] = []
_WATCHED = env_watch.install()
_WRITES = env_watch.WRITES
_SEEN = [-1, False]  # the environment write count when enabled() was last read, and its answer


@dataclass(frozen=True)
class ModelVerdict:
    """Which route serves a model's call signature: ``winner`` is ``"tracea"`` (patched) or ``"torch"``."""

    model: str
    signature: str
    winner: str
    patched_s: float  # median time of a patched call
    eager_s: float  # median time of an unpatched call

    @property
    def reason(self) -> str:
        """The fallback reason recorded when the unpatched model wins."""
        return (f"model check: {self.model} unpatched faster ({self.eager_s * 1e3:.3f} vs "
                f"{self.patched_s * 1e3:.3f} ms a call; {self.signature})")


def enabled() -> bool:
    """Whether patched models are judged (``TRACEA_MODEL_CHECK`` and ``TRACEA_ARBITER`` unset or not 0/off)."""
    return _arbiter_enabled() and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _on() -> bool:
    if _WATCHED and _SEEN[0] == _WRITES[0]:
        return bool(_SEEN[1])
    on = enabled()
    _SEEN[0], _SEEN[1] = _WRITES[0], on
    return on


def eager_route() -> bool:
    """Whether this thread runs an eager-routed forward: patched layers then compute as PyTorch's modules."""
    return _EAGER[0] > 0 and _tls.eager


def verdicts() -> list[ModelVerdict]:
    """Every model verdict reached in this process."""
    return list(_verdicts)


def reset() -> None:
    """Forget the verdict list (models keep the routes they were given)."""
    _verdicts.clear()


def run_eager(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with this thread's patched layers computing as PyTorch's modules."""
    if _tls.eager:
        return fn(*args, **kwargs)
    _tls.eager = True
    _EAGER[0] += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _EAGER[0] -= 1
        _tls.eager = False


def _describe(value: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.dtype, value.device, value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 2 and isinstance(value, (list, tuple)) and len(value) <= 16:
        return (type(value).__name__,) + tuple(_describe(v, depth + 1) for v in value)
    if depth < 2 and isinstance(value, dict) and len(value) <= 16:
        return ("dict",) + tuple((k, _describe(v, depth + 1)) for k, v in value.items())
    return type(value).__qualname__


_SCALARS = (type(None), bool, int, float, str)


def _signature(args: tuple, kwargs: dict[str, Any]) -> tuple:
    if not kwargs and len(args) == 1 and type(args[0]) is torch.Tensor:  # model(x): the common call, ~0.3 us
        t = args[0]
        return (t.shape, t.dtype, t.device, t.requires_grad)
    # flat arguments (tensors, None, scalars), one frame: ``model(x, k, v, mask)`` took 3 us through _describe
    # (a 2-core Zen 4 VM), as much as a decode step's attention. Tagged "flat": no other key starts so.
    key: list[Any] = ["flat"]
    for items in (args, kwargs.values()):
        for a in items:
            kind = type(a)
            if kind is torch.Tensor:
                key.append((a.shape, a.dtype, a.device, a.requires_grad))
            elif kind in _SCALARS:
                key.append((kind, a))
            else:
                return (_describe(args), tuple((k, _describe(v)) for k, v in kwargs.items()))
    if kwargs:
        key.append(tuple(kwargs))
    return tuple(key)


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth < 2 and isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    if depth < 2 and isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    return []


def _shown(args: tuple, kwargs: dict[str, Any]) -> str:
    parts = [f"{'x'.join(map(str, t.shape))} {str(t.dtype).removeprefix('torch.')} {t.device}"
             for t in _tensors((args, kwargs))[:3]]
    return ", ".join(parts) or "no tensors"


def _tracing() -> bool:
    """Tracing, exporting or a transform or dispatch mode active: calls that are not the user's real ones."""
    from .ops import _dispatch_modes, _function_modes, _tracing_state, _transforms_active

    return bool(torch.compiler.is_compiling() or _tracing_state() or _dispatch_modes() or _function_modes()
                or _transforms_active())


class _State:
    __slots__ = ("calls", "times", "route", "cuda")

    def __init__(self) -> None:
        self.calls = 0
        self.cuda = False
        self.times: dict[str, list[float]] = {"P": [], "E": []}
        self.route = ""  # "" while judging, then "P" or "E"


class ModelCheck:
    """One model's routes by call signature (see the module docstring)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.states: dict[tuple, _State] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        return (ModelCheck, (self.model_name,))  # a copy of the model is judged afresh

    def __call__(self, patched: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """Serve one call of the model: ``patched(*args, **kwargs)`` runs the patched forward; the eager
        route runs it under :func:`run_eager`."""
        if _tls.eager or not _on():
            return patched(*args, **kwargs)
        key = _signature(args, kwargs)
        try:
            st = self.states.get(key)
        except TypeError:  # (an argument of an unhashable value)
            return patched(*args, **kwargs)
        if st is None:
            with self._lock:
                if len(self.states) >= MAX_SIGNATURES:
                    return patched(*args, **kwargs)
                st = self.states.setdefault(key, _State())
        if st.route:  # (a CUDA graph being captured gets the patched layers, which route captured calls themselves)
            if st.route == "E" and not (st.cuda and _capturing()):
                return run_eager(patched, *args, **kwargs)
            return patched(*args, **kwargs)
        tensors = _tensors((args, kwargs))
        if not tensors or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or _tracing():
            return patched(*args, **kwargs)
        cuda = next((t.device for t in tensors if t.is_cuda), None)
        st.cuda = cuda is not None
        if cuda is not None and _capturing():
            return patched(*args, **kwargs)
        with self._lock:
            i = st.calls
            st.calls += 1
        if i >= len(_ORDER):  # (other threads finished the order meanwhile)
            return patched(*args, **kwargs)
        side = _ORDER[i]
        call = (lambda: run_eager(patched, *args, **kwargs)) if side == "E" else (lambda: patched(*args, **kwargs))
        if i < 2:
            return call()
        if cuda is not None:
            torch.cuda.synchronize(cuda)
        t0 = time.perf_counter()
        out = call()
        if cuda is not None:
            torch.cuda.synchronize(cuda)
        st.times[side].append(time.perf_counter() - t0)
        tp, te = st.times["P"], st.times["E"]
        if len(tp) == len(te) and len(tp) % ROUNDS == 0 and not st.route:
            self._decide(st, _shown(args, kwargs))
        return out

    def _decide(self, st: _State, shown: str) -> None:
        tp, te = st.times["P"], st.times["E"]
        p, e = statistics.median(tp), statistics.median(te)
        noise = max(max(t) / max(min(t), 1e-12) - 1 for t in (tp, te))
        settled = abs(p / max(e, 1e-12) - 1) > noise or len(tp) >= ROUNDS * (1 + EXTRA)
        if len(tp) < MAX_SAMPLES and not (settled and sum(tp) + sum(te) >= MIN_TIMED_S):
            return  # not settled: another round
        st.route = "E" if p > e * (1 + TIE) else "P"
        v = ModelVerdict(self.model_name, shown, "torch" if st.route == "E" else "tracea", p, e)
        _verdicts.append(v)
        if st.route == "E":
            record("model", v.reason)


__all__ = ["ENV", "EXTRA", "MAX_SAMPLES", "MAX_SIGNATURES", "MIN_TIMED_S", "ROUNDS", "TIE", "ModelCheck", "ModelVerdict", "enabled", "eager_route",
           "reset", "run_eager", "verdicts"]
