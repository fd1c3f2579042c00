"""Runner for Triton kernels (``@triton.jit`` functions) tuned by Tracea instead of ``triton.autotune``.

``tracea.tune_kernel("name", jit_fn, problem_size, args, tune_params, grid_div_x="BLOCK")``: the grid
(number of programs per axis) follows Kernel Tuner's rule, ``ceil(problem_size / grid_div)``.
Tunable parameters that are arguments of the kernel (``tl.constexpr`` meta-parameters such as
``BLOCK``) are passed by name; ``num_warps``, ``num_stages``, ``num_ctas`` and ``maxnreg`` go to the
launch. Arrays are torch CUDA tensors (NumPy and CuPy arrays are copied to one); scalars are passed
as given. A config Triton cannot compile (out of shared memory, registers) is a failed config, not an
error. Times come from CUDA events around single launches, in ms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tracea.errors import CompilationError, InvalidArgumentError, LaunchError, UnsupportedDeviceError
from tracea.usertune.runner import Launch

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


class TritonRunner:
    """:class:`tracea.usertune.runner.KernelRunner` for ``@triton.jit`` kernels on one GPU."""

    lang = "TRITON"
    returns_time = False
    max_threads = None

    def __init__(self, device: int | None) -> None:
        try:
            import torch
            import triton
        except ImportError as exc:
            raise UnsupportedDeviceError(f"Triton kernels need torch and triton ({exc})") from None
        if not torch.cuda.is_available():
            raise UnsupportedDeviceError("Triton kernels need a CUDA GPU visible to torch")
        from tracea.doctor.doctor import get_doctor

        self.torch, self.triton = torch, triton
        self.index = int(device or 0)
        self.device = torch.device("cuda", self.index)
        self.device_name = torch.cuda.get_device_name(self.index)
        self.profile = get_doctor().profile_for(f"cuda:{self.index}")

    def environment(self) -> dict[str, str]:
        return {"triton": str(self.triton.__version__), "torch": str(self.torch.__version__),
                "torch_cuda": str(self.torch.version.cuda)}

    def prepare_arguments(self, arguments: Sequence[Any], inplace: bool = False) -> list[Any]:
        torch = self.torch
        out = []
        for i, a in enumerate(arguments):
            if isinstance(a, torch.Tensor) or isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__"):
                if inplace and isinstance(a, torch.Tensor) and a.device == self.device and a.is_contiguous():
                    out.append([a, a])
                    continue
                t = a if isinstance(a, torch.Tensor) else torch.as_tensor(a, device=self.device)
                t = t.to(self.device).contiguous().clone()
                out.append([a if inplace else t.clone(), t])
            elif isinstance(a, (np.generic, int, float, bool)):
                out.append([a, a.item() if isinstance(a, np.generic) else a])
            else:
                raise InvalidArgumentError(f"arguments[{i}]", a, "a tensor / array or a scalar")
        self._scratch = [[o, c.clone() if isinstance(c, torch.Tensor) else c] for o, c in out]
        return out

    def _split(self, launch: Launch) -> tuple[dict[str, Any], dict[str, Any]]:
        fn = launch.origin
        arg_names = list(getattr(fn, "arg_names", []))
        meta, opts = {}, {}
        for k, v in launch.params.items():
            if k in LAUNCH_OPTIONS:
                opts[k] = v
            elif k in arg_names:
                meta[k] = v
            else:
                raise InvalidArgumentError("tune_params", k, f"a kernel argument ({', '.join(arg_names)}) or one of "
                                                             f"{', '.join(LAUNCH_OPTIONS)}")
        return meta, opts

    def _launch(self, launch: Launch, args: list[Any]) -> None:
        meta, opts = self._split(launch)
        grid = tuple(g for g in launch.grid)
        launch.origin[grid](*[cur for _, cur in args], **meta, **opts)

    def compile(self, launch: Launch) -> Any:
        # Triton compiles on the first launch; do it here so failures are compile failures.
        scratch = getattr(self, "_scratch", None)
        if scratch is None:
            raise CompilationError("prepare_arguments must run before compile", backend="triton")
        try:
            with self.torch.cuda.device(self.index):
                self._launch(launch, scratch)
                self.torch.cuda.synchronize(self.index)
        except InvalidArgumentError:
            raise
        except Exception as exc:  # noqa: BLE001 - CompilationError, OutOfResources ...
            raise CompilationError(f"{launch.name} failed to compile or launch: {type(exc).__name__}: {exc}",
                                   backend="triton") from None
        return launch

    def reset_arguments(self, args: list[Any]) -> None:
        for orig, cur in args:
            if isinstance(cur, self.torch.Tensor) and orig is not cur:
                cur.copy_(self.torch.as_tensor(orig, device=self.device))

    def run(self, kernel: Any, args: list[Any], launch: Launch) -> None:
        try:
            with self.torch.cuda.device(self.index):
                self._launch(launch, args)
                self.torch.cuda.synchronize(self.index)
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"{launch.name} failed: {exc}", backend="triton") from None

    def benchmark(self, kernel: Any, args: list[Any], launch: Launch, iterations: int) -> list[float]:
        torch = self.torch
        times = []
        with torch.cuda.device(self.index):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._launch(launch, args)
            for _ in range(iterations):
                start.record()
                self._launch(launch, args)
                end.record()
                end.synchronize()
                times.append(float(start.elapsed_time(end)))
        return times

    def results(self, args: list[Any], only: Sequence[int] | None = None) -> list[Any]:
        return [(cur.detach().cpu().numpy() if only is None or i in only else None)
                if isinstance(cur, self.torch.Tensor) else cur for i, (_, cur) in enumerate(args)]

    def copy_back(self, args: list[Any]) -> None:
        for orig, cur in args:
            if orig is cur or not isinstance(cur, self.torch.Tensor):
                continue
            if isinstance(orig, self.torch.Tensor):
                orig.copy_(cur.view(orig.shape))
            elif isinstance(orig, np.ndarray) and orig.flags.writeable:
                orig[...] = cur.cpu().numpy().reshape(orig.shape)
            elif hasattr(orig, "__cuda_array_interface__"):
                import cupy

                orig[...] = cupy.asarray(cur).reshape(orig.shape)

    def close(self) -> None:
        self._scratch = None  # type: ignore[assignment]
