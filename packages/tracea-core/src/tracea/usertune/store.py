"""User-kernel results in Tracea's tuning cache (the fingerprinted ``.tracea/tuning_cache.json``).

An entry's op key is ``user:<lang>:<kernel name>:<hash>``; the hash covers what makes a tuned config
specific to one problem: the kernel source (or the generator's code), problem size, the arguments'
kinds, dtypes and shapes (and scalar values), the tunable parameter space, grid divisors, block size
names, compiler options and defines. The fingerprint covers the device and its environment like every
other entry, plus the runner's own facts (for C, the C++ compiler). The entry's config holds the
tunable parameters. Restrictions are not hashed: a cached best config is reused only while it still
satisfies the call's restrictions.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..ir.device import Device

KIND = "user_kernel"


def _describe_value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "src") and hasattr(v, "run"):  # a Triton JITFunction
        return str(v.src)
    if callable(v):
        try:
            return inspect.getsource(v)
        except (OSError, TypeError):
            return getattr(v, "__qualname__", repr(v))
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        shape = tuple(int(s) for s in v.shape)
        if shape == ():
            return f"{type(v).__name__}:{v.dtype}:{v.item() if hasattr(v, 'item') else v}"
        return f"{type(v).__module__.split('.')[0]}:{v.dtype}:{shape}"
    if isinstance(v, Mapping):
        return {str(k): _describe_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_describe_value(x) for x in v]
    return repr(v)


def signature_hash(**parts: Any) -> str:
    text = json.dumps({k: _describe_value(v) for k, v in parts.items()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class UserKernelOp:
    """The "op" of a user kernel for the tuning cache: a key and a JSON description."""

    lang: str
    kernel_name: str
    digest: str
    problem_size: tuple[Any, ...]
    arguments: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"user:{self.lang.lower()}:{self.kernel_name}:{self.digest}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "lang": self.lang, "kernel_name": self.kernel_name, "digest": self.digest,
                "problem_size": list(self.problem_size), "arguments": list(self.arguments)}

    def describe(self) -> str:
        ps = "x".join(str(p) for p in self.problem_size)
        return f"{self.lang} kernel {self.kernel_name} {ps}"


@dataclass(frozen=True)
class UserKernelVariant:
    """Stands in for a variant in fingerprints (the device facts); the runner's own facts (compiler)
    are part of the op key, since fingerprints are memoised per variant name."""

    name: str
    backend: str


_BACKENDS = {"C": "cpu", "CUDA": "cuda", "TRITON": "cuda", "OPENCL": "opencl"}


def variant_for(lang: str, kernel_name: str) -> UserKernelVariant:
    return UserKernelVariant(name=f"user.{lang.lower()}.{kernel_name}", backend=_BACKENDS.get(lang, lang.lower()))


def op_for(lang: str, kernel_name: str, problem: Sequence[int], arguments: Sequence[Any],
           runner_env: Mapping[str, Any], **parts: Any) -> UserKernelOp:
    """The op of one tuning problem; ``runner_env`` (the runner's compiler and driver facts) and
    ``parts`` (source, space, options) go into its digest."""
    args = tuple(str(_describe_value(a)) for a in arguments)
    env = {str(k): str(v) for k, v in runner_env.items()}
    digest = signature_hash(lang=lang, kernel_name=kernel_name, problem=list(problem), arguments=list(args),
                            runner_env=env, **parts)
    return UserKernelOp(lang, kernel_name, digest, tuple(problem), args)


def lookup(cache: Any, op: UserKernelOp, variant: UserKernelVariant, profile: Any) -> Any:
    """The cached entry for this kernel/problem/device, or None."""
    try:
        return cache.lookup(op, variant, profile)
    except Exception:  # noqa: BLE001 - a cache problem never blocks tuning
        return None


def record(cache: Any, op: UserKernelOp, variant: UserKernelVariant, profile: Any, config: Any,
           times_s: Sequence[float], trials: int) -> bool:
    """Store the best config with its measured times; True when written."""
    from ..tuning.goals import time_stats

    stats = time_stats(times_s)
    if not stats:
        return False
    entry = cache.make_entry(op, variant, profile, config, stats, trials=trials)
    return bool(cache.put(entry))


def is_user_entry(entry: Any) -> bool:
    return isinstance(getattr(entry, "op", None), dict) and entry.op.get("kind") == KIND


def describe_entry(entry: Any) -> str:
    """``CUDA kernel matmul_kernel 4096x4096`` for ``tracea cache ls``."""
    op = entry.op
    ps = "x".join(str(p) for p in op.get("problem_size", []))
    return f"{op.get('lang', '?')} kernel {op.get('kernel_name', '?')} {ps}".strip()


def config_text(entry: Any) -> str:
    """The tunable parameters of a user-kernel entry (``block_size_x=32,tile=4``)."""
    from .space import PREFIX

    return ",".join(f"{k[len(PREFIX):] if k.startswith(PREFIX) else k}={v}" for k, v in entry.config.params)


def entry_status(entry: Any) -> str:
    """``current`` when the entry's device fingerprint matches a device here, ``stale`` when it
    differs, ``?`` when its device is absent (compiler facts are checked when the kernel is tuned)."""
    try:
        from ..doctor.doctor import get_doctor
        from ..tuning.fingerprint import device_fingerprint

        profile = get_doctor().profile_for(Device.parse(entry.device or "cpu"))
        return "current" if device_fingerprint(profile) == entry.device_fp else "stale"
    except Exception:  # noqa: BLE001
        return "?"
