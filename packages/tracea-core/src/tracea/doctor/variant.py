"""Kernel variants: one kernel family of one backend (e.g. ``cpu.gemm.avx512``), with the requirements
it places on an op and a device, its search space and hero configs, a performance estimate, and the
code that runs it.

Backends subclass :class:`KernelVariant` and return instances from the ``tracea_register_variants``
hook. The Doctor matches :class:`Requirements` (data) plus :meth:`KernelVariant.check` (code, for
conditions data cannot express) against each op and records every reason a variant is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..dtypes import DType, Fp32Precision
from ..ir.epilogue import EpilogueKind
from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, LayerType, Layout, Op
from ..semantic.config import PipelineConfig, Validity
from ..semantic.search_space import SearchSpace
from .code_hash import module_source_hash
from .profile import DeviceProfile

ALL_EPILOGUES = frozenset(EpilogueKind)
FLOAT_DTYPES = frozenset({DType.F64, DType.F32, DType.F16, DType.BF16})


@dataclass(frozen=True)
class Requirements:
    """What a variant needs from an op and a device. Every unmet item becomes one rejection reason.

    :param device_kind: the device kind served (``"cpu"``, ``"cuda"``, ``"opencl"``).
    :param op_kind: the operator family.
    :param dtypes: accepted input storage dtypes.
    :param out_dtypes: accepted output dtypes; None means "the input dtype only".
    :param epilogues: supported epilogue steps.
    :param isa: flags the device profile must all have (``"avx512f"``, ``"sm_90a"``, ``"cl_khr_fp16"``).
    :param min_compute_capability: lowest CUDA compute capability, or None.
    :param fp32_precisions: accepted :class:`Fp32Precision` for float32 inputs; None accepts all.
    :param layouts: conv2d layouts served; None serves all.
    :param transposes: whether transposed GEMM operands are served.
    :param batched: whether batch > 1 is served.
    :param groups: whether conv2d groups > 1 is served.
    :param dilation: whether conv2d dilation != 1 is served.
    :param causal: whether causal attention is served.
    :param masks: attention mask kinds served (``"bool"``, ``"additive"``); empty: no ``attn_mask``.
    :param value_head_dim: whether attention with V's head dim unlike Q's and K's is served.
    :param dropout: whether attention dropout (``dropout_p`` > 0) is served.
    :param lse: whether the attention log-sum-exp output (``AttentionOp.lse``) is served.
    :param alignment: every contiguous (leading) dimension must be a multiple of this many elements.
    :param max_dims: upper limits by op field name (``{"head_dim": 256}``).
    :param min_dims: lower limits by op field name.
    """

    device_kind: str
    op_kind: LayerType
    dtypes: frozenset[DType] = frozenset({DType.F32})
    out_dtypes: frozenset[DType] | None = None
    epilogues: frozenset[EpilogueKind] = ALL_EPILOGUES
    isa: tuple[str, ...] = ()
    min_compute_capability: tuple[int, int] | None = None
    fp32_precisions: frozenset[Fp32Precision] | None = None
    layouts: frozenset[Layout] | None = None
    transposes: bool = True
    batched: bool = True
    groups: bool = True
    dilation: bool = True
    causal: bool = True
    masks: frozenset[str] = frozenset()
    value_head_dim: bool = False
    dropout: bool = False
    lse: bool = False
    alignment: int = 1
    max_dims: Mapping[str, int] = field(default_factory=dict)
    min_dims: Mapping[str, int] = field(default_factory=dict)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        """Every reason ``op`` on ``profile`` fails these requirements (empty list: all met)."""
        reasons: list[str] = []
        if op.kind is not self.op_kind:
            return [f"serves {self.op_kind.value}, not {op.kind.value}"]
        if profile.device.kind != self.device_kind:
            return [f"runs on {self.device_kind} devices, not {profile.device.kind}"]
        for dt in dict.fromkeys(op.dtypes):  # each distinct input dtype once
            if dt not in self.dtypes:
                reasons.append(f"input dtype {dt.value} not in {{{', '.join(sorted(d.value for d in self.dtypes))}}}")
        outs = self.out_dtypes if self.out_dtypes is not None else frozenset(op.dtypes)
        if op.out_dtype not in outs:
            reasons.append(f"output dtype {op.out_dtype.value} not supported")
        for step in op.epilogue:  # type: ignore[attr-defined]
            if step not in self.epilogues:
                reasons.append(f"epilogue step {step.value} not supported")
        missing = [f for f in self.isa if not profile.has(f)]
        if missing:
            reasons.append(f"device lacks {', '.join(missing)}")
        if self.min_compute_capability is not None:
            cc = profile.compute_capability
            if cc is None or tuple(cc) < tuple(self.min_compute_capability):
                need = ".".join(map(str, self.min_compute_capability))
                reasons.append(f"needs compute capability >= {need}, device has "
                               f"{'.'.join(map(str, cc)) if cc else 'none'}")
        fp32 = getattr(op, "fp32_precision", None)
        if (self.fp32_precisions is not None and fp32 is not None and DType.F32 in op.dtypes
                and fp32 not in self.fp32_precisions):
            reasons.append(f"fp32 precision '{fp32.value}' not served (serves "
                           f"{', '.join(sorted(p.value for p in self.fp32_precisions))})")
        if isinstance(op, GemmOp):
            if not self.transposes and (op.trans_a or op.trans_b):
                reasons.append("transposed operands not supported")
            if not self.batched and op.batch > 1:
                reasons.append("batched GEMM not supported")
        if isinstance(op, Conv2dOp):
            if self.layouts is not None and op.layout not in self.layouts:
                reasons.append(f"layout {op.layout.name} not supported")
            if not self.groups and op.groups != 1:
                reasons.append(f"groups={op.groups} not supported (only 1)")
            if not self.dilation and op.dilation != (1, 1):
                reasons.append(f"dilation={op.dilation} not supported (only 1)")
        if isinstance(op, AttentionOp):
            if not self.causal and op.causal:
                reasons.append("causal masking not supported")
            if op.mask is not None and op.mask not in self.masks:
                reasons.append(f"{op.mask} attn_mask not supported")
            if op.head_dim_v is not None and not self.value_head_dim:
                reasons.append(f"value head dim {op.head_dim_v} unlike head_dim {op.head_dim} not supported")
            if op.dropout_p and not self.dropout:
                reasons.append(f"dropout_p={op.dropout_p:g}: no Tracea kernel applies dropout")
            if op.lse and not self.lse:
                reasons.append("no log-sum-exp output (return_lse)")
        if self.alignment > 1:
            for name, size in leading_dims(op).items():
                if size % self.alignment:
                    reasons.append(f"{name}={size} is not a multiple of {self.alignment} elements")
        for name, limit in self.max_dims.items():
            value = getattr(op, name, None)
            if isinstance(value, int) and value > limit:
                reasons.append(f"{name}={value} exceeds {limit}")
        for name, limit in self.min_dims.items():
            value = getattr(op, name, None)
            if isinstance(value, int) and value < limit:
                reasons.append(f"{name}={value} is below {limit}")
        return reasons


def leading_dims(op: Op) -> dict[str, int]:
    """The contiguous (fastest-varying) dimension of every operand, by a readable name."""
    if isinstance(op, GemmOp):
        return {("A.m" if op.trans_a else "A.k"): op.m if op.trans_a else op.k,
                ("B.k" if op.trans_b else "B.n"): op.k if op.trans_b else op.n, "C.n": op.n}
    if isinstance(op, Conv2dOp):
        if op.layout is Layout.NHWC:
            return {"x.C": op.c, "out.K": op.k}
        return {"x.W": op.w, "out.Q": op.q}
    if isinstance(op, AttentionOp):
        return {"head_dim": op.head_dim}
    return {}


class OpArgs:
    """The arrays of one call, by role, as the caller's framework holds them.

    GEMM: ``a``, ``b``, ``bias`` (or None), ``out``. conv2d: ``x``, ``w``, ``bias``, ``out``.
    attention: ``q``, ``k``, ``v``, ``out``. Every array is packed row-major in the physical shape the
    op describes: GEMM ``a`` is (m, k), or (k, m) when ``trans_a``, with a leading batch axis when
    ``op.batch > 1`` (one of size 1 may be present or not: reshape by the op's fields). ``adapter`` is the
    :class:`~tracea.runtime.arrays.ArrayAdapter` owning them (``adapter.to_numpy`` gives host views).
    """

    def __init__(self, arrays: Mapping[str, Any], out: Any, adapter: Any) -> None:
        self.arrays = dict(arrays)
        self.out = out
        self.adapter = adapter

    def __getattr__(self, name: str) -> Any:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    def host(self, name: str) -> Any:
        """A NumPy view of argument ``name`` (or ``"out"``); None stays None."""
        obj = self.out if name == "out" else self.arrays.get(name)
        return None if obj is None else self.adapter.to_numpy(obj)


class KernelVariant:
    """Base class of every kernel variant. Subclasses set the class attributes and override methods.

    Class attributes: ``name`` (unique, dotted: ``backend.op.flavour``), ``backend`` (the plugin's
    name), ``requirements`` (:class:`Requirements`), ``description`` (one line for ``tracea doctor``),
    ``priority`` (tie-break when estimates are equal; the reference backend uses -1000) and
    ``efficiency`` (fraction of the device's peak the variant expects to reach, used by
    :meth:`estimate_seconds`), ``fallback_only`` (True for oracles such as the reference backend:
    ranked after every other accepted variant whatever the estimates say) and ``wave_quantized``
    (False for GPU kernels of many small blocks resident together, e.g. weight-streaming GEMVs: the
    performance model then adds no wave-quantization penalty for the config's tile).
    """

    name: str = ""
    backend: str = ""
    requirements: Requirements
    description: str = ""
    priority: int = 0
    efficiency: float = 0.5
    fallback_only: bool = False
    wave_quantized: bool = True

    def source_hash(self) -> str:
        """The code this variant's kernels come from, part of its tuning fingerprint: by default a hash of
        the Python sources of the package that defines the variant's class (:func:`module_source_hash`),
        so configs tuned and verdicts reached on older code are measured again. Override it (a string,
        or a method taking the op) to narrow it to what changes the kernels."""
        return module_source_hash(type(self).__module__)

    @property
    def op_kind(self) -> LayerType:
        return self.requirements.op_kind

    @property
    def device_kind(self) -> str:
        return self.requirements.device_kind

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        """All reasons this variant cannot serve ``op`` on ``profile``; extend with ``super().check``."""
        return self.requirements.check(op, profile)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        """The configs a tuner may try for ``op`` on ``profile``."""
        return SearchSpace()

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        """Known-good configs, best first; the first valid one runs when nothing is tuned."""
        return [PipelineConfig()]

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        """Whether ``config`` can run ``op`` on ``profile`` (shared memory, threads, registers ...)."""
        return config.validate(profile)

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """Roofline estimate: max(FLOPs / (peak * efficiency), bytes / bandwidth), plus a launch cost."""
        dtype = op.dtypes[0].value if op.dtypes else "float32"
        flop_time = op.flops / (profile.peak(dtype) * 1e9 * max(self.efficiency, 1e-6))
        bw = profile.bandwidth_gbs or 20.0
        byte_time = op.min_bytes / (bw * 1e9)
        return max(flop_time, byte_time) + 5e-6

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        """Compile/load whatever ``run`` needs (cached by the backend). Called before timing so
        compilation is never measured. Default: nothing to prepare."""
        return None

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        """Compute ``op`` on ``args`` with ``config``, writing ``args.out``."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def takes_strides(self, op: Op) -> bool:
        """Whether this variant's launcher reads strided operands as described by ``op.strides``
        (attention: :attr:`~tracea.ir.ops.AttentionOp.strides`). False (the default): dispatch hands it
        packed arrays (:func:`tracea.runtime.attention_strides.packing_launcher`)."""
        return False

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """A fast launcher ``launch(*inputs, out)`` for the plan cache (inputs in ``op.roles`` order),
        or None to be run through :meth:`run` on every call. Called once per call signature, after
        :meth:`prepare`; see the ``tracea_bind_variant`` hook for the contract."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def run_launcher(run: Any, variant: KernelVariant, op: Op, config: PipelineConfig, profile: DeviceProfile,
                 adapter: Any) -> Any:
    """A launcher ``launch(*inputs, out)`` calling ``run(variant=, op=, config=, args=, profile=)`` (the
    ``tracea_run_variant`` hook, or its default) on every call, for variants without :meth:`bind`."""
    roles = op.roles

    def launch(*arrays: Any) -> None:
        run(variant=variant, op=op, config=config, args=OpArgs(dict(zip(roles, arrays)), arrays[-1], adapter),
            profile=profile)

    return launch


def flatten(results: Iterable[Any]) -> list[Any]:
    """Flatten hook results that are lists (or single items, or None) into one list."""
    out: list[Any] = []
    for r in results:
        if r is None:
            continue
        if isinstance(r, (list, tuple)):
            out.extend(x for x in r if x is not None)
        else:
            out.append(r)
    return out
