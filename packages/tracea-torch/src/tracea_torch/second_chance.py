"""The arbiter's second chance: when PyTorch's kernel beats Tracea's first choice for a layer signature.

The Doctor's first choice on a shape nobody tuned is a ranked guess; the arbiter (:mod:`tracea_torch.arbiter`)
measures it against PyTorch on the signature's first call. When PyTorch's kernel wins on device time,
the next few candidates -- the configs and variants first-use tuning would time
(:func:`tracea.runtime.first_use.alternatives`, at most :data:`RETRIES`) -- are timed on the same call
against PyTorch, paired as the verdict was (a CPU GEMM that streams its weights on weight copies, see
:data:`tracea_torch.arbiter.WEIGHT_STREAMING`). The one with the best ratio, if clearly better than the first
choice's (:data:`MARGIN`, in its own time and relative to PyTorch's) and agreeing with PyTorch's result, is persisted as a tuned entry of the
tuning cache, so the Doctor chooses it from then on (here and in later processes), and the arbiter
judges it like any choice. Only losing signatures pay this (a few compilations on their first call);
``TRACEA_ARBITER=0`` turns it off with the arbiter.

The alternatives are built (compiled) in worker threads, while the first choice itself is built
(:func:`prefetch`, for a signature with no verdict yet on a host with :data:`MIN_CPUS` or more), and
timed one after the other only once every build is done: NVRTC and the C compiler run outside the GIL,
and compilation is most of a patched CNN's first call (H100, DenseNet-121 fp16 batch 32 on empty caches:
79 s, of which 67 s in 207 NVRTC compilations and 50 s in the second chances of 55 lost signatures).
``TRACEA_COMPILE_THREADS=1`` builds them one at a time, after the verdict.
"""

from __future__ import annotations

import functools
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from tracea.doctor.decision import Decision
from tracea.errors import BackendError, TraceaError, TuningCacheWarning
from tracea.runtime import first_use

from . import arbiter

#: alternatives timed after a lost verdict
RETRIES = 3
#: a verdict is worth a second chance when Tracea's kernel time exceeds PyTorch's by this factor (closer
#: losses are not worth the first call's extra compilations: H100, a ViT-S/ResNeXt-50 first forward took
#: 0.4 / 9.5 s without second chances and 5.3 / 19.5 s with them on every lost signature)
LOST_BY = 1.05
#: an alternative replaces the first choice only when both its time and its time relative to PyTorch's
#: are at most this share of the first choice's (measurement noise must not flip a choice)
MARGIN = 0.97


#: the fewest CPUs on which alternatives are compiled ahead, beside the first choice's compilation
MIN_CPUS = 4


def _threads() -> int:
    """``TRACEA_COMPILE_THREADS`` (default: one per alternative); 1 builds one at a time."""
    try:
        return max(1, int(os.environ.get("TRACEA_COMPILE_THREADS", "") or RETRIES))
    except ValueError:
        return RETRIES


def _build(build_run: Callable[[Any, Any], Callable[..., torch.Tensor]], choice: tuple[Any, Any]
           ) -> Callable[..., torch.Tensor] | TraceaError:
    try:
        return build_run(*choice)
    except TraceaError as exc:
        return exc


def _in_worker(device: torch.device, build_run: Callable[[Any, Any], Callable[..., torch.Tensor]]
               ) -> Callable[[tuple[Any, Any]], Callable[..., torch.Tensor] | TraceaError]:
    """:func:`_build` for a worker thread: on CUDA, ``device`` made current first (a new thread has no
    current context to load modules into). Whatever a build raises there makes that alternative no
    candidate (a :class:`BackendError` naming it): a build that only fails off the calling thread must
    not fail the user's forward."""
    index = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()

    def work(choice: tuple[Any, Any]) -> Callable[..., torch.Tensor] | TraceaError:
        try:
            if index is not None:
                torch.cuda.set_device(index)
            return _build(build_run, choice)
        except Exception as exc:  # noqa: BLE001 - see above
            return BackendError(f"building {getattr(choice[0], 'name', choice[0])} in a worker thread failed: "
                                f"{type(exc).__name__}: {exc}", backend=device.type)

    return work


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's share), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def built(choices: list[tuple[Any, Any]], build_run: Callable[[Any, Any], Callable[..., torch.Tensor]],
          device: torch.device) -> list[Callable[..., torch.Tensor] | TraceaError]:
    """``build_run(variant, config)`` for each choice, in order (a :class:`TraceaError` in place of a run
    that cannot be built here). With more than one choice and CPU to spare, the builds run in worker
    threads (:func:`_threads`; on CUDA each with ``device`` current), so their compilations overlap (NVRTC
    and the C compiler run outside the GIL; whatever a worker's build raises makes that choice no
    candidate); one at a time, anything but a TraceaError is raised."""
    workers = min(len(choices), _threads(), _cpus())
    if workers < 2 or _capturing(device):  # (a module load from another thread would invalidate a capture)
        return [_build(build_run, c) for c in choices]
    with ThreadPoolExecutor(workers, thread_name_prefix="tracea-build") as pool:
        return list(pool.map(_in_worker(device, build_run), choices))


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class Prefetch:
    """Alternatives to a decision's choice being built in worker threads (see :func:`prefetch`)."""

    def __init__(self, decision: Decision, choices: list[tuple[Any, Any]], pool: ThreadPoolExecutor,
                 futures: list[Any]) -> None:
        self.decision, self.choices, self._pool, self._futures = decision, choices, pool, futures

    def wait(self) -> None:
        """Block until every build is done (nothing runs in the background afterwards)."""
        self._pool.shutdown(wait=True)

    def results(self) -> list[Callable[..., torch.Tensor] | TraceaError]:
        """The builds' results, in the order of ``choices`` (as :func:`built` gives them)."""
        self.wait()
        return [f.result() for f in self._futures]


def prefetch(decision: Decision, build_run: Callable[[Any, Any], Callable[..., torch.Tensor]],
             device: torch.device) -> Prefetch | None:
    """Start building the alternatives :func:`retry` would time, in worker threads, so that their
    compilations overlap the first choice's (the caller builds that one meanwhile and calls
    :meth:`Prefetch.wait` before anything is timed: the arbiter's timings see an idle host). Only with
    the arbiter on, for a choice with no verdict in the tuning cache yet, on a host with at least
    :data:`MIN_CPUS` CPUs, outside CUDA graph capture; None otherwise."""
    workers = _threads()
    if (device.type not in ("cuda", "cpu") or workers < 2 or _cpus() < MIN_CPUS or not arbiter.enabled()
            or decision.variant.fallback_only or _capturing(device) or arbiter.has_verdict(decision)):
        return None
    choices = first_use.alternatives(decision, RETRIES)
    if not choices:
        return None
    work = _in_worker(device, build_run)
    pool = ThreadPoolExecutor(min(len(choices), workers), thread_name_prefix="tracea-build")
    return Prefetch(decision, choices, pool, [pool.submit(work, c) for c in choices])


def worth_retrying(verdict: arbiter.Verdict) -> bool:
    """Whether a verdict lost on kernel time by more than :data:`LOST_BY` (device time on CUDA, the
    alternating time on the CPU), was measured now (a cached verdict had its chance in the process that
    measured it) and not for a wrong result."""
    if verdict.source != "measured" or verdict.note.startswith("result differed"):
        return False
    if not (verdict.tracea_s == verdict.tracea_s and verdict.torch_s == verdict.torch_s):
        return False
    return verdict.tracea_s > LOST_BY * verdict.torch_s


def retry(decision: Decision, device: torch.device, verdict: arbiter.Verdict,
          build_run: Callable[[Any, Any], Callable[..., torch.Tensor]], run_torch: Callable[..., torch.Tensor],
          args: tuple, ahead: Prefetch | None = None) -> bool:
    """Time the alternatives to ``decision``'s choice (``build_run(variant, config)`` gives a run like the
    plan's, ``run_torch`` PyTorch's) on ``args``; persist the best if it beats the first choice's ratio
    to PyTorch (``verdict``) by :data:`MARGIN`. True when a tuned entry was written (decide again).
    ``ahead``: the alternatives already built (:func:`prefetch`) for this decision."""
    first_ratio = verdict.tracea_s / max(verdict.torch_s, 1e-12)
    best: tuple[float, Any, Any, float] | None = None
    # timed as the verdict was: a CPU GEMM streaming its weights on weight copies out of L2
    cpu_cold = device.type != "cuda" and arbiter._weight_streaming(decision.op)
    with torch.no_grad():
        ref = run_torch(*args)
        tol = arbiter.TOLERANCE.get(ref.dtype, 5e-2)
        if ahead is not None and ahead.decision is decision:
            choices, runs = ahead.choices, ahead.results()
        else:
            choices = first_use.alternatives(decision, RETRIES)
            runs = built(choices, build_run, device)
        for (variant, cfg), run in zip(choices, runs):
            if isinstance(run, TraceaError):
                continue  # it does not compile here: not a candidate
            try:
                ours = run(*args)
            except TraceaError:
                continue  # it does not run here: not a candidate
            if not arbiter._rel_err(ours, ref) <= tol:
                continue
            fa: Callable[[], Any]
            fb: Callable[[], Any]
            if device.type == "cuda":
                fa, fb = arbiter.cold_weight_calls(run, run_torch, args)
            elif cpu_cold:
                fa, fb = arbiter.cpu_cold_weight_calls(run, run_torch, args, decision.profile)
            else:
                fa, fb = functools.partial(run, *args), functools.partial(run_torch, *args)
            try:
                t_ours, t_theirs = (arbiter._paired(fa, fb, arbiter._gpu_batch) if device.type == "cuda"
                                    else arbiter._cpu_alternating(fa, fb))
            except TraceaError:
                continue
            ratio = t_ours / max(t_theirs, 1e-12)
            if best is None or ratio < best[0]:
                best = (ratio, variant, cfg, t_ours)
    if best is None or best[0] > MARGIN * first_ratio or best[3] > MARGIN * verdict.tracea_s:
        return False  # (better both relative to PyTorch's time, which drifts, and in its own time)
    ratio, variant, cfg, t_ours = best
    written = first_use.persist(decision, variant, cfg, [t_ours])
    if not written:
        warnings.warn(f"tracea: {decision.op.describe()}: {variant.name} {cfg.key} ran {first_ratio / ratio:.2f}x "
                      "faster than the first choice, but no tuning cache took it", TuningCacheWarning, stacklevel=3)
    return written


__all__ = ["LOST_BY", "MARGIN", "MIN_CPUS", "RETRIES", "Prefetch", "built", "prefetch", "retry", "worth_retrying"]
