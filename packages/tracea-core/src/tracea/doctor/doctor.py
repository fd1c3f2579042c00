"""The Doctor (L3): capability profiler + variant registry + decision engine, over the plugin manager.

One process-wide instance (:func:`get_doctor`) caches what plugins report; :meth:`Doctor.decide` is on
the dispatch path and memoises decisions per (op, device, cache generation).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .._version import __version__
from ..errors import NoVariantError, PluginError, UnsupportedDeviceError
from ..ir.device import Device
from ..ir.ops import Op
from ..plugins.backend_info import BackendInfo
from ..plugins.manager import TraceaPluginManager, get_plugin_manager, on_change as on_plugin_change
from ..runtime import plans
from ..runtime.arrays import ArrayAdapter, builtin_adapters
from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace
from .cached_config import doctor_entry_problem, warn_ignored
from .decision import Candidate, Decision, FrameworkFaster, Rejection
from .profile import DeviceProfile
from .registry import VariantRegistry
from .variant import KernelVariant, flatten

ENV_VARIANT = "TRACEA_VARIANT"
ENV_EXCLUDE = "TRACEA_EXCLUDE_VARIANTS"


class Doctor:
    """Answers: which devices and backends are here, and which variant should run an op."""

    def __init__(self, pm: TraceaPluginManager | None = None) -> None:
        self._pm = pm
        self._lock = threading.RLock()
        self._backends: list[BackendInfo] | None = None
        self._profiles: list[DeviceProfile] | None = None
        self._registry: VariantRegistry | None = None
        self._adapters: tuple[ArrayAdapter, ...] | None = None
        self._decisions: dict[tuple[Any, ...], Decision] = {}
        self._env: dict[Device, dict[str, str]] = {}
        self._quarantine: dict[tuple[str, Any], str] = {}  # (variant, op) -> why it is not chosen again
        self._data_files: dict[tuple[Any, ...], list[Any]] = {}  # (device, extra files) -> loaded data files
        # device -> (key, PerfModel, the user observations it was fitted to)
        self._models: dict[Device, tuple[tuple[Any, ...], Any, list[Any]]] = {}
        self.registry_errors: list[str] = []

    @property
    def pm(self) -> TraceaPluginManager:
        return self._pm if self._pm is not None else get_plugin_manager()

    # -- what is here ----------------------------------------------------------------------------
    def backends(self) -> list[BackendInfo]:
        """Every backend's self-description, with version mismatches turned into notes."""
        with self._lock:
            if self._backends is None:
                infos = [b for b in flatten(self.pm.hook.tracea_backend_info()) if isinstance(b, BackendInfo)]
                self._backends = sorted(infos, key=lambda b: b.name)
            return list(self._backends)

    def version_mismatches(self) -> list[str]:
        """Backends whose version differs from tracea-core's (versions move in lockstep)."""
        return [f"{b.package or b.name} {b.version} != tracea-core {__version__}"
                for b in self.backends() if b.version != __version__]

    def profiles(self) -> list[DeviceProfile]:
        """Every device profile; the first profile reported for a device wins."""
        with self._lock:
            if self._profiles is None:
                seen: dict[Device, DeviceProfile] = {}
                for p in flatten(self.pm.hook.tracea_device_profiles()):
                    if isinstance(p, DeviceProfile) and p.device not in seen:
                        seen[p.device] = p
                host = [p for d, p in seen.items() if d.kind == "cpu"]
                others = sorted((p for d, p in seen.items() if d.kind != "cpu"), key=lambda p: p.device)
                self._profiles = host + others
            return list(self._profiles)

    def profile_for(self, device: Device | str) -> DeviceProfile:
        """The profile of ``device`` or :class:`UnsupportedDeviceError` naming the devices that exist."""
        device = Device.parse(device)
        for p in self.profiles():
            if p.device == device:
                return p
        have = ", ".join(str(p.device) for p in self.profiles()) or "none"
        hint = {"cuda": " (install tracea-cuda with CuPy: pip install tracea-cuda[cuda13])",
                "opencl": " (install tracea-opencl and an OpenCL runtime)"}.get(device.kind, "")
        raise UnsupportedDeviceError(f"no installed backend serves device {device}; devices present: {have}{hint}")

    @property
    def registry(self) -> VariantRegistry:
        with self._lock:
            if self._registry is None:
                reg = VariantRegistry()
                for v in flatten(self.pm.hook.tracea_register_variants()):
                    try:
                        reg.add(v)
                    except PluginError as exc:
                        self.registry_errors.append(str(exc))
                if self.registry_errors and os.environ.get("TRACEA_STRICT_PLUGINS"):
                    raise PluginError("; ".join(self.registry_errors))
                self._registry = reg
            return self._registry

    def variants(self) -> list[KernelVariant]:
        return list(self.registry)

    def adapters(self) -> tuple[ArrayAdapter, ...]:
        """Array adapters in descending priority: plugins' and NumPy, then the generic DLPack describer."""
        adapters = self._adapters
        if adapters is None:
            with self._lock:
                extra = [a for a in flatten(self.pm.hook.tracea_array_adapters()) if isinstance(a, ArrayAdapter)]
                adapters = self._adapters = tuple(sorted(extra + builtin_adapters(), key=lambda a: -a.priority))
        return adapters

    def environment(self, profile: DeviceProfile) -> dict[str, str]:
        """Facts from the ``tracea_environment`` hook for ``profile`` (first value of each key wins)."""
        with self._lock:
            if profile.device not in self._env:
                env: dict[str, str] = {}
                for part in self.pm.hook.tracea_environment(profile=profile):
                    for k, v in (part or {}).items():
                        env.setdefault(str(k), str(v))
                self._env[profile.device] = env
            return dict(self._env[profile.device])

    def best_device(self) -> Device:
        """The device where the fastest non-reference variants live: CUDA, then OpenCL GPUs, then the CPU."""
        usable = {v.device_kind for v in self.registry if v.backend != "reference"}
        order = {"cuda": 0, "opencl": 2, "cpu": 3}
        ranked = []
        for p in self.profiles():
            if p.device.kind not in usable and p.device.kind != "cpu":
                continue
            rank = order.get(p.device.kind, 1)
            if p.device.kind == "opencl" and "gpu" not in p.arch.lower():
                rank = 4
            ranked.append((rank, p.device))
        return min(ranked)[1] if ranked else Device.cpu()

    # -- tuning hooks ------------------------------------------------------------------------------
    def search_space(self, variant: KernelVariant, op: Op, profile: DeviceProfile) -> SearchSpace:
        """The variant's search space (the first plugin answering ``tracea_search_space`` wins)."""
        space = self.pm.hook.tracea_search_space(variant=variant, op=op, profile=profile)
        return space if space is not None else SearchSpace()

    def hero_configs(self, variant: KernelVariant, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        """Hero configs from every plugin, deduplicated, in hook order."""
        out: list[PipelineConfig] = []
        for cfg in flatten(self.pm.hook.tracea_hero_configs(variant=variant, op=op, profile=profile)):
            if isinstance(cfg, PipelineConfig) and cfg not in out:
                out.append(cfg)
        return out

    # -- decisions ---------------------------------------------------------------------------------
    def check(self, variant: KernelVariant, op: Op, profile: DeviceProfile) -> list[str]:
        """Why ``variant`` cannot serve ``op`` on ``profile`` (empty: it can). Plugin errors become reasons."""
        try:
            return list(variant.check(op, profile))
        except Exception as exc:  # noqa: BLE001 - a broken variant is rejected, not fatal
            return [f"check() raised {type(exc).__name__}: {exc}"]

    def candidates(self, op: Op, device: Device | str) -> list[tuple[KernelVariant, DeviceProfile]]:
        """Variants that accept ``op`` on ``device`` (no config chosen), for the tuner."""
        profile = self.profile_for(device)
        return [(v, profile) for v in self.registry.for_kind(op.kind) if not self.check(v, op, profile)]

    def default_config(self, variant: KernelVariant, op: Op, profile: DeviceProfile) -> tuple[PipelineConfig, str] | str:
        """The first valid hero config, else the first valid search-space point; a reason string if none."""
        reasons = []
        for cfg in self.hero_configs(variant, op, profile):
            v = variant.validate_config(op, cfg, profile)
            if v:
                return cfg, "hero"
            reasons.append(f"hero {cfg.key}: {v.reason}")
        for i, cfg in enumerate(self.search_space(variant, op, profile)):
            if i >= 256:
                break
            if variant.validate_config(op, cfg, profile):
                return cfg, "space"
        return "no valid config" + (f" ({'; '.join(reasons[:3])})" if reasons else "")

    def decide(self, op: Op, device: Device | str, *, variant: str | None = None,
               config: PipelineConfig | None = None, use_cache: bool = True,
               framework_check: bool = False) -> Decision:
        """Rank every variant for ``op`` on ``device``.

        :param variant: force this variant name (also ``TRACEA_VARIANT``, a comma-separated list whose
            entry for this op kind applies); rejection reasons still explain a refused force. A forced
            variant whose only reasons are :class:`~tracea.doctor.decision.FrameworkFaster` (a speed
            judgement, not a limit) runs.
        :param config: force this config (validated).
        :param use_cache: consult the tuning cache for measured evidence.
        :param framework_check: the caller times the chosen variant against the framework's own call before
            using it: variants whose only reasons are :class:`~tracea.doctor.decision.FrameworkFaster`
            stay candidates (``Candidate.framework_faster`` holds the reasons).
        :raises NoVariantError: when nothing accepts the op (with every rejection reason).
        """
        device = Device.parse(device)
        forced = variant or self._env_variant(op)
        cache = _tuning_cache() if use_cache else None
        keep = framework_check or forced is not None
        memo_key = (op, device, forced, config, cache, _generation(cache),
                    os.environ.get("TRACEA_PERF_MODEL"), os.environ.get("TRACEA_PERF_DATA"), keep)
        with self._lock:
            hit = self._decisions.get(memo_key)
        if hit is not None:
            return hit
        decision = self._decide(op, device, forced, config, cache, keep)
        with self._lock:
            if len(self._decisions) > 4096:
                self._decisions.clear()
            self._decisions[memo_key] = decision
        return decision

    def _env_variant(self, op: Op) -> str | None:
        for name in (os.environ.get(ENV_VARIANT) or "").split(","):
            name = name.strip()
            v = self.registry.get(name) if name else None
            if v is not None and v.op_kind is op.kind:
                return name
        return None

    def _decide(self, op: Op, device: Device, forced: str | None, config: PipelineConfig | None,
                cache: Any, keep_framework_faster: bool = False) -> Decision:
        profile = self.profile_for(device)
        excluded = {n.strip() for n in (os.environ.get(ENV_EXCLUDE) or "").split(",") if n.strip()}
        variants = self.registry.for_kind(op.kind)
        if forced is not None:
            if self.registry.get(forced) is None:
                raise NoVariantError(f"variant {forced!r} is not registered; registered {op.kind.value} variants: "
                                     + ", ".join(v.name for v in variants))
        candidates: list[Candidate] = []
        rejected: list[Rejection] = []
        elsewhere = [v.name for v in variants if v.device_kind != device.kind]
        model = self.perf_model(profile, cache)
        for v in variants:
            if forced is not None and v.name != forced:
                continue
            if v.device_kind != device.kind and forced is None:
                continue  # serves another device kind: not a candidate, listed in Decision.elsewhere
            if v.name in excluded:
                rejected.append(Rejection(v.name, v.backend, [f"excluded by {ENV_EXCLUDE}"]))
                continue
            why = self._quarantine.get((v.name, op))
            if why is not None and forced is None:
                rejected.append(Rejection(v.name, v.backend, [f"quarantined: {why}"]))
                continue
            reasons = self.check(v, op, profile)
            soft = ""
            if reasons and keep_framework_faster and all(isinstance(r, FrameworkFaster) for r in reasons):
                soft, reasons = "; ".join(reasons), []
            if reasons:
                rejected.append(Rejection(v.name, v.backend, reasons))
                continue
            cand = self._candidate(v, op, profile, config, cache, model)
            if isinstance(cand, str):
                rejected.append(Rejection(v.name, v.backend, [cand]))
            else:
                cand.framework_faster = soft
                candidates.append(cand)
        if not candidates:
            raise NoVariantError(f"no kernel variant can run {op.describe()} on {device}",
                                 {r.variant: r.reasons for r in rejected})
        candidates.sort(key=lambda c: c.rank_key)
        return Decision(op, device, profile, candidates, rejected, elsewhere, _model_line(model, candidates))

    # -- the performance model ---------------------------------------------------------------------
    def perf_model(self, profile: DeviceProfile, cache: Any = None) -> Any:
        """The performance model for ``profile`` (:mod:`tracea.perfmodel`) from the backends' shipped data
        and this device's tuning records in ``cache``; None when ``TRACEA_PERF_MODEL=0`` or the model
        cannot be built (then candidates are ranked by their roofline estimates)."""
        from .. import perfmodel  # noqa: PLC0415

        if not perfmodel.enabled():
            return None
        extra = tuple(perfmodel.extra_files())
        key = (id(cache), _generation(cache) if cache is not None else -1, extra)
        with self._lock:
            hit = self._models.get(profile.device)
            if hit is not None and hit[0] == key:
                return hit[1]
        user: list[Any] = []
        try:
            files = self._perf_files(profile, extra)
            entries = cache.entries() if cache is not None else []
            device_fp = _device_fp(profile)
            user = perfmodel.user_observations(entries, device_fp) if device_fp else []
            if hit is not None and hit[0][0] == key[0] and hit[0][2] == extra and hit[2] == user:
                # the cache changed in nothing the model is fitted to (arbiter verdicts, tuned configs
                # without their default's time): no refit (a fit took ~40 ms on an H100 host, and a
                # patched DenseNet-121's first forward changed the cache ~90 times)
                model = hit[1]
            else:
                model = perfmodel.build(profile, {v.name: v for v in self.registry}, files, entries, device_fp,
                                        user=user)
        except Exception as exc:  # noqa: BLE001 - a model problem never blocks dispatch
            model = perfmodel.PerfModel(perfmodel.arch_key(profile),
                                        problems=[f"model not built: {type(exc).__name__}: {exc}"])
        with self._lock:
            self._models[profile.device] = (key, model, user)
        return model

    def _perf_files(self, profile: DeviceProfile, extra: tuple[str, ...]) -> list[Any]:
        from .. import perfmodel  # noqa: PLC0415

        key = (profile.device, extra)
        with self._lock:
            if key in self._data_files:
                return self._data_files[key]
        paths: list[str] = []
        try:
            paths = [str(p) for p in flatten(self.pm.hook.tracea_perf_data(profile=profile)) if p]
        except Exception as exc:  # noqa: BLE001 - a broken plugin: no shipped data
            self.registry_errors.append(f"tracea_perf_data raised {type(exc).__name__}: {exc}")
        files = [perfmodel.load_file(p) for p in dict.fromkeys(paths + list(extra))]
        with self._lock:
            self._data_files[key] = files
        return files

    def _candidate(self, v: KernelVariant, op: Op, profile: DeviceProfile, config: PipelineConfig | None,
                   cache: Any, model: Any = None) -> Candidate | str:
        if config is not None:
            valid = v.validate_config(op, config, profile)
            if not valid:
                return f"forced config {config.key} invalid: {valid.reason}"
            secs, est = self._estimate(v, op, profile, config, model)
            return Candidate(v, config, "forced", secs, estimate=est)
        entry = None
        if cache is not None:
            try:
                entry = cache.lookup(op, v.name, profile)
            except Exception:  # noqa: BLE001 - a cache problem never blocks dispatch
                entry = None
        note = ""
        if entry is not None:  # cached configs are data from outside: run only what the tuner could produce
            why = doctor_entry_problem(self, entry, v, op, profile)
            if why is None:
                secs, est = self._estimate(v, op, profile, entry.config, model)
                return Candidate(v, entry.config, "cache", secs, measured_s=float(entry.median_s), estimate=est)
            warn_ignored(entry, why)
            note = f"tuning-cache entry ignored: {why}"
        found = self.default_config(v, op, profile)
        if isinstance(found, str):
            return found + (f" ({note})" if note else "")
        cfg, source = found
        secs, est = self._estimate(v, op, profile, cfg, model)
        return Candidate(v, cfg, source, secs, note=note, estimate=est)

    @staticmethod
    def _estimate(v: KernelVariant, op: Op, profile: DeviceProfile, cfg: PipelineConfig,
                  model: Any = None) -> tuple[float, Any]:
        """(seconds, :class:`tracea.perfmodel.Estimate` or None): the model's estimate when it has data
        for this device, else the variant's own roofline estimate."""
        if model is not None and model.points:
            try:
                est = model.estimate(v, op, profile, cfg)
                if est.seconds > 0:
                    return float(est.seconds), est
            except Exception:  # noqa: BLE001 - fall back to the variant's own estimate
                pass
        try:
            return float(v.estimate_seconds(op, profile, cfg)), None
        except Exception:  # noqa: BLE001
            return float("inf"), None

    def quarantine(self, variant: str, op: Op, why: str) -> None:
        """Never choose ``variant`` for ``op`` again in this process (it failed at run time): the next
        candidate runs instead. A tuning-cache entry that made it the winner is removed, so no other
        process reuses it. Forcing the variant by name still runs it (tests, debugging)."""
        with self._lock:
            self._quarantine[(variant, op)] = why
        try:
            cache = _tuning_cache()
            if cache is not None:
                cache.remove(lambda e: e.variant == variant and e.op_key == op.key)
        except Exception:  # noqa: BLE001 - a cache problem never blocks dispatch
            pass
        self.invalidate()

    def invalidate(self) -> None:
        """Forget memoised decisions and every call plan built from them (after tuning, or when the
        cache changed)."""
        with self._lock:
            self._decisions.clear()
            self._models.clear()
        plans.invalidate("Doctor.invalidate()")

    def explain(self, op: Op, device: Device | str | None = None) -> str:
        """:meth:`Decision.explain` for ``op``, or the NoVariantError text."""
        try:
            return self.decide(op, device or self.best_device()).explain()
        except NoVariantError as exc:
            return str(exc)


def _model_line(model: Any, candidates: list[Candidate]) -> str:
    """The Decision's line on how untuned candidates were ranked."""
    if not any(c.measured_s is None for c in candidates):
        return ""
    if model is None:
        return "roofline estimates (performance model off: TRACEA_PERF_MODEL=0)"
    text = model.describe() if model.points else f"roofline estimates (no measured data for {model.arch})"
    if model.problems:
        text += "; " + "; ".join(model.problems)
    return text


def _device_fp(profile: DeviceProfile) -> str:
    try:
        from ..tuning.fingerprint import device_fingerprint  # noqa: PLC0415

        return device_fingerprint(profile)
    except Exception:  # noqa: BLE001 - no tuner: no user data
        return ""


_get_cache: Any = None


def _generation(cache: Any) -> int:
    """The cache's generation (re-reading a changed file); 0 when it cannot be read."""
    try:
        return int(getattr(cache, "generation", 0))
    except Exception:  # noqa: BLE001 - an unreadable cache must not stop dispatch
        return 0


def _tuning_cache() -> Any:
    """The process tuning cache, or None when the tuner is unavailable or the cache unreadable.

    The import is resolved once: this runs on every dispatch."""
    global _get_cache
    if _get_cache is None:
        try:
            from ..tuning.cache import get_cache
        except ImportError:
            get_cache = lambda: None  # type: ignore[assignment,return-value]  # noqa: E731
        _get_cache = get_cache
    try:
        return _get_cache()
    except Exception:  # noqa: BLE001 - an unreadable cache must not stop dispatch
        return None


_doctor: Doctor | None = None
_doctor_lock = threading.Lock()


def get_doctor() -> Doctor:
    """The process-wide Doctor over the process-wide plugin manager."""
    global _doctor
    with _doctor_lock:
        if _doctor is None:
            _doctor = Doctor()
        return _doctor


def reset_doctor() -> None:
    """Drop the process-wide Doctor (tests, or after changing plugins)."""
    global _doctor
    with _doctor_lock:
        _doctor = None
    plans.invalidate("reset_doctor()")


on_plugin_change(reset_doctor)  # a new plugin manager: new backends, new decisions
plans.adapters_from(lambda: get_doctor().adapters())
