"""The AutoTuner (seed API ``AutoTuner(gpu_info).optimize(problem) -> PipelineConfig``).

For an op on a device it asks the Doctor for the candidate variants, and for each: looks the result
up in the tuning cache (a hit costs no measurement), else searches the variant's space (see
:mod:`tracea.tuning.loop`) with old cache entries, configs of similar shapes and hero configs first,
measures every candidate with :class:`~tracea.tuning.measure.Measurer` (checked against the reference
backend) and stores the best in the cache. ``trials`` is the number of measured configs *per variant*.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..doctor.cached_config import config_problem, entry_problem, warn_ignored
from ..doctor.profile import DeviceProfile
from ..errors import NoVariantError, TraceaError, UnsupportedConfigError
from ..ir.device import Device
from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace
from .busy import warn_if_busy
from .cache import CacheEntry, TuningCache, get_cache
from .fingerprint import plugin_manager
from .goals import OptimizationGoal
from .inputs import InputSets, pick_adapter, reference_output, tolerance
from .refcheck import reference_check
from .loop import TrialRecord, Validator, search
from .measure import Measurer
from .progress import Progress
from .search import resolve_sampler


@dataclass
class VariantResult:
    """Tuning outcome of one variant: best config and score (None/inf when every trial failed)."""

    variant: str
    config: PipelineConfig | None
    score_s: float
    median_s: float
    trials: list[TrialRecord] = field(default_factory=list)
    from_cache: bool = False
    entry: CacheEntry | None = None


@dataclass
class TuneResult:
    """What :meth:`AutoTuner.tune` found: the best ``config`` of the best ``variant``, its time, every
    trial (``history``), each variant's outcome, and whether it came from the cache."""

    op: Op
    device: Device
    goal: OptimizationGoal
    variant: str | None
    config: PipelineConfig | None
    score_s: float
    median_s: float
    history: list[TrialRecord]
    variants: dict[str, VariantResult]
    sampler: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.config is not None

    @property
    def from_cache(self) -> bool:
        return bool(self.variants) and all(v.from_cache for v in self.variants.values())

    @property
    def best_s(self) -> float:
        """Median time of the best config (alias of :attr:`median_s`)."""
        return self.median_s

    @property
    def measured_trials(self) -> int:
        return sum(1 for t in self.history if t.status != "invalid")

    @property
    def tflops(self) -> float:
        """Throughput of the best config at its median time."""
        return self.op.flops / self.median_s / 1e12 if self.ok and self.median_s > 0 else 0.0

    def convergence(self) -> list[float]:
        """Best score so far after each measured trial (inf until the first success)."""
        return [t.best_so_far_s for t in self.history if t.status != "invalid"]

    def plot(self, path: str) -> str:
        """Save the convergence plot (best time vs trial) as a PNG; needs matplotlib."""
        from .plot import plot_convergence

        return plot_convergence(self, path)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op.key, "device": str(self.device), "goal": self.goal.value,
                "variant": self.variant, "config": self.config.to_dict() if self.config else None,
                "score_s": self.score_s if self.ok else None, "median_s": self.median_s if self.ok else None,
                "tflops": self.tflops, "from_cache": self.from_cache, "sampler": self.sampler,
                "elapsed_s": self.elapsed_s, "trials": [t.to_json() for t in self.history]}


class AutoTuner:
    """Tunes ops on one device.

    :param device_info: a :class:`tracea.GPUInfo` (anything with ``to_profile()``), a
        :class:`DeviceProfile`, or None for the Doctor's profile of the op's device.
    :param goal: what to optimise (:class:`OptimizationGoal` or its name).
    :param trials: measured configs per variant.
    :param timeout_s: wall-clock budget of one :meth:`tune` call, and the limit for a single run.
    :param seed: sampler seed (None: nondeterministic).
    :param cache: the :class:`TuningCache` (default :func:`get_cache`); ``False`` disables caching.
    :param progress: show a progress bar on a terminal.
    :param doctor: the Doctor (default: the process Doctor).
    :param sampler: ``"auto"`` (the candidate-set GP where numpy+scipy import, else TPE), ``"gp"``,
        ``"optuna-gp"`` (optuna's stock GPSampler), ``"tpe"``, ``"random"`` (see :mod:`tracea.tuning.search`).
    """

    def __init__(self, device_info: Any = None, *, goal: OptimizationGoal | str = OptimizationGoal.MaximizeTFLOPS,
                 trials: int = 40, timeout_s: float | None = None, seed: int | None = None,
                 cache: TuningCache | bool | None = None, progress: bool = True, doctor: Any = None,
                 sampler: str = "auto", warmup: int = 2, min_repeats: int = 5, max_repeats: int = 50,
                 budget_s: float = 0.2) -> None:
        self.goal = OptimizationGoal.parse(goal)
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError("trials", trials, "a positive integer")
        self.trials, self.timeout_s, self.seed = trials, timeout_s, seed
        self._cache = cache
        self.progress, self._doctor, self.sampler = progress, doctor, sampler
        self.warmup, self.min_repeats, self.max_repeats, self.budget_s = warmup, min_repeats, max_repeats, budget_s
        self.profile = _as_profile(device_info)
        self._references: dict[tuple[str, int], Any] = {}

    # -- collaborators ------------------------------------------------------------------------------
    @property
    def doctor(self) -> Any:
        if self._doctor is None:
            from ..doctor.doctor import get_doctor

            self._doctor = get_doctor()
        return self._doctor

    @property
    def cache(self) -> TuningCache | None:
        if self._cache is False:
            return None
        return get_cache() if self._cache is None or self._cache is True else self._cache  # type: ignore[return-value]

    @property
    def pm(self) -> Any:
        return plugin_manager(self._doctor if self._doctor is not None else self.doctor)

    def profile_for(self, device: Device | str | None) -> DeviceProfile:
        """The tuner's own profile for its device, else the Doctor's (``None``: the best device)."""
        if self.profile is not None and (device is None or Device.parse(device) == self.profile.device):
            return self.profile
        return self.doctor.profile_for(Device.parse(device) if device is not None else self.doctor.best_device())

    def candidates(self, op: Op, device: Device | str | None) -> list[tuple[Any, DeviceProfile]]:
        """Tunable variants the Doctor accepts for ``op`` (the reference only when nothing else is)."""
        profile = self.profile_for(device)
        items = []
        for item in self.doctor.candidates(op, profile.device):
            variant = item[0] if isinstance(item, tuple) else getattr(item, "variant", item)
            items.append((variant, profile))
        if not items:
            raise NoVariantError(f"no variant serves {op.describe()} on {profile.device}")
        tunable = [it for it in items if getattr(it[0], "backend", "") != "reference"]
        return tunable or items

    # -- the seed API -------------------------------------------------------------------------------
    def optimize(self, problem: Any) -> PipelineConfig:
        """Tune ``problem`` (a :class:`~tracea.ir.ProblemDescriptor`) and return the best config."""
        result = self.tune(problem.op, problem.device)
        if result.config is None:
            raise UnsupportedConfigError(_failure_summary(result))
        return result.config

    def tune(self, op: Op, device: Device | str | None = None, variant: Any = None, *,
             goal: OptimizationGoal | str | None = None, trials: int | None = None, force: bool = False,
             seeds: Iterable[PipelineConfig] | Mapping[str, Sequence[PipelineConfig]] = ()) -> TuneResult:
        """Tune ``op`` on ``device`` (default: the Doctor's best device) over every candidate variant
        (or just ``variant``: object or name).

        A variant already tuned in this environment is taken from the cache unless ``force``.
        ``seeds`` are extra starting configs (configs of similar shapes), tried after cache and hero
        configs: a list for every variant, or a mapping from variant name to its list.
        """
        start = time.monotonic()
        goal_ = OptimizationGoal.parse(goal) if goal is not None else self.goal
        profile = self.profile_for(device)
        pairs = self.candidates(op, profile.device)
        if variant is not None:
            name = variant if isinstance(variant, str) else variant.name
            pairs = [p for p in pairs if p[0].name == name] or \
                ([(variant, profile)] if not isinstance(variant, str) else [])
            if not pairs:
                raise NoVariantError(f"variant {name} does not serve {op.describe()} on {profile.device}")
        deadline = start + self.timeout_s if self.timeout_s else None
        results: dict[str, VariantResult] = {}
        history: list[TrialRecord] = []
        measurer: Measurer | None = None
        for v, prof in pairs:
            cache = self.cache
            hit = None if (force or cache is None) else cache.lookup(op, v, prof, goal_)
            if hit is not None and self._ignored(hit, op, v, prof):
                hit = None  # an entry dispatch would not run is retuned, not reported as the answer
            if hit is not None:
                results[v.name] = VariantResult(v.name, hit.config, hit.score_s, hit.median_s, [], True, hit)
                continue
            if measurer is None:
                if prof.device.kind == "cpu":
                    warn_if_busy()
                measurer = self._measurer(op, prof)
            extra = seeds.get(v.name, ()) if isinstance(seeds, Mapping) else seeds
            res = self._tune_variant(op, v, prof, goal_, trials or self.trials, measurer, list(extra),
                                     deadline, len(history))
            history.extend(res.trials)
            results[v.name] = res
        ok = [r for r in results.values() if r.config is not None]
        best = min(ok, key=lambda r: r.score_s) if ok else None
        return TuneResult(op, profile.device, goal_, best.variant if best else None,
                          best.config if best else None, best.score_s if best else math.inf,
                          best.median_s if best else math.inf, history, results,
                          sampler=self._sampler_name(), elapsed_s=time.monotonic() - start)

    # -- internals ----------------------------------------------------------------------------------
    def _sampler_name(self) -> str:
        return resolve_sampler(self.sampler)

    def _measurer(self, op: Op, profile: DeviceProfile) -> Measurer:
        pm = self.pm
        adapters: list[Any] = []
        for r in pm.hook.tracea_array_adapters():
            adapters.extend(r if isinstance(r, (list, tuple)) else [r] if r else [])
        from ..runtime.arrays import builtin_adapters

        adapters.extend(builtin_adapters())
        adapter = pick_adapter(adapters, profile.device, op.dtypes)
        caches = dict(profile.caches or {})
        big = max(caches.values()) if caches else 0
        inputs = InputSets(op, profile.device, adapter, seed=0 if self.seed is None else self.seed,
                           cache_bytes=int(big))
        return Measurer(op, profile, pm, inputs, self._reference(op, inputs), tolerance(op),
                        warmup=self.warmup, min_repeats=self.min_repeats, max_repeats=self.max_repeats,
                        budget_s=self.budget_s, timeout_s=self.timeout_s)

    def _reference(self, op: Op, inputs: InputSets) -> Any:
        key = (op.key, id(inputs))
        if key not in self._references:
            ref_variant, cpu = self._reference_variant(op)
            self._references = {key: reference_check(
                op, inputs.host[0], lambda o, h: reference_output(o, h, ref_variant, cpu),
                seed=0 if self.seed is None else self.seed)}
        return self._references[key]

    def _reference_variant(self, op: Op) -> tuple[Any, DeviceProfile]:
        cpu = self.doctor.profile_for(Device.cpu())
        for v in self.doctor.variants():
            if getattr(v, "oracle", False) and not v.check(op, cpu):
                return v, cpu
        raise TraceaError(f"no reference variant serves {op.describe()}: cannot check tuning results")

    def _space(self, op: Op, variant: Any, profile: DeviceProfile) -> SearchSpace:
        space = self.pm.hook.tracea_search_space(variant=variant, op=op, profile=profile)
        return space if space is not None else variant.search_space(op, profile)

    def _heroes(self, op: Op, variant: Any, profile: DeviceProfile) -> list[PipelineConfig]:
        out: list[PipelineConfig] = []
        for r in self.pm.hook.tracea_hero_configs(variant=variant, op=op, profile=profile):
            out.extend(r if isinstance(r, (list, tuple)) else [r] if r else [])
        return out

    def cache_entry_problem(self, entry: CacheEntry, op: Op, variant: Any, profile: DeviceProfile) -> str | None:
        """Why the tuner must not use ``entry`` (a result, a seed) for ``op``: the rule dispatch
        applies to cached configs (:mod:`tracea.doctor.cached_config`); warns once per entry."""
        why = entry_problem(entry, variant, op, profile, space=lambda: self._space(op, variant, profile),
                            heroes=lambda: self._heroes(op, variant, profile))
        if why is not None:
            warn_ignored(entry, why)
        return why

    def _ignored(self, entry: CacheEntry, op: Op, variant: Any, profile: DeviceProfile) -> bool:
        return self.cache_entry_problem(entry, op, variant, profile) is not None

    def _tune_variant(self, op: Op, variant: Any, profile: DeviceProfile, goal: OptimizationGoal, trials: int,
                      measurer: Measurer, seeds: Sequence[PipelineConfig], deadline: float | None,
                      start_number: int) -> VariantResult:
        space = self._space(op, variant, profile)
        cache = self.cache
        seed_list: list[tuple[PipelineConfig, str]] = []
        if cache is not None:  # old entries, as long as they pass the rule dispatch applies
            seed_list += [(e.config, "cache") for e in cache.stale(op, variant)
                          if not self._ignored(e, op, variant, profile)]
        seed_list += [(c, "hero") for c in self._heroes(op, variant, profile)]
        seed_list += [(c, "similar") for c in seeds]

        def check(config: PipelineConfig) -> str | None:
            v = variant.validate_config(op, config, profile)
            return None if v else (getattr(v, "reason", "") or "rejected by validate_config")

        validator = Validator(space, check)
        total = min(trials, max(1, space.cardinality) + len(seed_list))
        label = f"tune {op.describe()} [{variant.name}]"
        with Progress(total, label, enabled=self.progress) as bar:
            records = search(space, lambda c: measurer.measure(variant, c), variant=variant.name, goal=goal,
                             trials=trials, validator=validator, seeds=seed_list, sampler=self.sampler,
                             seed=self.seed, deadline=deadline, start_number=start_number,
                             on_trial=lambda r: bar.update(r.best_so_far_s, r.status, op.flops)
                             if r.status != "invalid" else None)
        ok = [r for r in records if r.ok]
        if not ok:
            return VariantResult(variant.name, None, math.inf, math.inf, records)
        best = min(ok, key=lambda r: r.score_s)
        entry = None
        # Dispatch runs only hero configs and points of the space (tracea.doctor.cached_config): a
        # caller's seed outside them may win the search, but the cache keeps the best config that
        # dispatch accepts.
        keep = None
        if cache is not None:
            heroes = self._heroes(op, variant, profile)
            keep = next((r for r in sorted(ok, key=lambda r: r.score_s)
                         if config_problem(variant, op, profile, r.config, space=space, heroes=heroes) is None), None)
        if cache is not None and keep is not None:
            stats = dict(keep.stats, score_s=keep.score_s)
            default = next((c for c in self._heroes(op, variant, profile) if variant.validate_config(op, c, profile)),
                           None)
            measured = [r.median_s for r in ok if default is not None and r.config == default]
            if measured and math.isfinite(measured[0]):  # what an untuned call runs: the performance model's data
                stats["default_s"] = measured[0]
            entry = cache.make_entry(op, variant, profile, keep.config, stats, goal=goal,
                                     trials=sum(1 for r in records if r.status != "invalid"))
            cache.put(entry)
        return VariantResult(variant.name, best.config, best.score_s, best.median_s, records, False, entry)


def _as_profile(device_info: Any) -> DeviceProfile | None:
    if device_info is None or isinstance(device_info, DeviceProfile):
        return device_info
    to_profile = getattr(device_info, "to_profile", None)
    if callable(to_profile):
        return to_profile()
    from ..errors import InvalidArgumentError
    raise InvalidArgumentError("device_info", device_info, "a GPUInfo, a DeviceProfile or None")


def _failure_summary(result: TuneResult) -> str:
    lines = [f"no config ran correctly for {result.op.describe()} on {result.device}:"]
    for t in result.history[-5:]:
        lines.append(f"  {t.variant} {t.config.key}: {t.status} {t.reason}")
    return "\n".join(lines)
