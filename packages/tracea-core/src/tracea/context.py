"""``tracea.Context``: a device-bound handle with the seed's API (``ctx.matmul``, ``ctx.synchronize``,
``ctx.optimize_graph``)."""

from __future__ import annotations

from typing import Any

from . import ops
from .doctor.doctor import Doctor, get_doctor
from .doctor.profile import DeviceProfile
from .errors import InvalidArgumentError, ShapeError, UnsupportedDeviceError
from .graph import Graph
from .ir.device import Device
from .ir.epilogue import Epilogue
from .ir.ops import Op
from .runtime.arrays import find_adapter
from .tuning.goals import OptimizationGoal


class Context:
    """Binds calls to one device.

    :param device: None picks the best device present (CUDA, then an OpenCL GPU, then the CPU);
        ``"cpu"``, ``"cuda:1"`` or a :class:`Device`; or a device name such as ``"GeForce RTX 3070"`` /
        ``"H200"`` matched (case-insensitively, as a substring) against the devices present.
    :param goal: default :class:`OptimizationGoal` for tuning through this context.
    """

    def __init__(self, device: str | Device | None = None, *,
                 goal: OptimizationGoal = OptimizationGoal.MaximizeTFLOPS, doctor: Doctor | None = None) -> None:
        self.doctor = doctor or get_doctor()
        self.device = self._resolve(device)
        self.profile: DeviceProfile = self.doctor.profile_for(self.device)
        self.goal = goal

    def _resolve(self, device: str | Device | None) -> Device:
        if device is None:
            return self.doctor.best_device()
        if isinstance(device, Device):
            return device
        if not isinstance(device, str):
            raise InvalidArgumentError("device", device, "None, a Device, 'kind[:index]' or a device name")
        head = device.split(":")[0].strip().lower()
        if head.isidentifier() and (head in ("cpu", "cuda", "opencl") or ":" in device):
            return Device.parse(device)
        wanted = device.lower()
        for p in self.doctor.profiles():
            if wanted in p.name.lower() or p.name.lower() in wanted:
                return p.device
        names = ", ".join(f"{p.device} ({p.name})" for p in self.doctor.profiles())
        raise UnsupportedDeviceError(f"no device named {device!r} here; devices present: {names}")

    def _on_device(self, arrays: dict[str, Any]) -> None:
        adapters = self.doctor.adapters()
        for name, obj in arrays.items():
            if obj is None:
                continue
            dev = find_adapter(obj, adapters, name).info(obj).device
            if dev != self.device:
                raise UnsupportedDeviceError(f"argument '{name}' is on {dev}, this context is on {self.device}")

    def matmul(self, a: Any, b: Any, c: Any, m: int, n: int, k: int, epilogue: Epilogue | str | None = None,
               bias: Any = None) -> Any:
        """Seed API: ``c = epilogue(a @ b [+ bias])`` for (m, k) ``a`` and (k, n) ``b``, written into ``c``.

        ``m``, ``n``, ``k`` must agree with the arrays' shapes (a safety check against stale sizes).
        """
        self._on_device({"a": a, "b": b, "c": c, "bias": bias})
        for name, arr, want in (("a", a, (m, k)), ("b", b, (k, n)), ("c", c, (m, n))):
            shape = tuple(getattr(arr, "shape", ()))
            if shape[-2:] != want:
                raise ShapeError(name, arr, f"shape {want} for m={m}, n={n}, k={k}")
        return ops.matmul(a, b, bias=bias, epilogue=epilogue, out=c)

    gemm = matmul

    def conv2d(self, x: Any, w: Any, b: Any = None, **kwargs: Any) -> Any:
        """:func:`tracea.ops.conv2d` with a device check."""
        self._on_device({"x": x, "w": w, "b": b})
        return ops.conv2d(x, w, b, **kwargs)

    def attention(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        """:func:`tracea.ops.attention` with a device check."""
        self._on_device({"q": q, "k": k, "v": v})
        return ops.attention(q, k, v, **kwargs)

    def synchronize(self) -> None:
        """Wait for all work issued on this context's device."""
        self.doctor.pm.hook.tracea_synchronize(device=self.device)

    def explain(self, op: Op) -> str:
        """Why the Doctor would run ``op`` the way it does on this device."""
        return self.doctor.explain(op, self.device)

    def optimize_graph(self, graph: Graph, iterations: int = 15, goal: OptimizationGoal | None = None,
                       **kwargs: Any) -> Any:
        """Tune every node of ``graph`` on this device with a shared budget (see docs/tuning.md)."""
        from .tuning.graph import optimize_graph

        return optimize_graph(graph, iterations=iterations, goal=goal or self.goal, device=self.device,
                              doctor=self.doctor, **kwargs)

    def __repr__(self) -> str:
        return f"Context({self.device}, {self.profile.name!r})"
