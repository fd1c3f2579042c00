"""Runner for user CUDA kernels (``tracea.tune_kernel(..., lang="CUDA")``) through CuPy and NVRTC.

Like Kernel Tuner's CuPy backend: the instance source (defines prepended) is compiled with
``cupy.RawModule(code, options, name_expressions=[name])``, ``--std=c++11`` added unless an ``-std``
option is given; ``cmem_args`` are copied to the module's ``__constant__`` symbols; ``smem_args``
sets the dynamic shared memory. Arrays are copied to the GPU (NumPy, CuPy and torch CUDA tensors
alike; the caller's arrays are never written); scalars must be NumPy scalars. Each config runs once
untimed, then ``iterations`` times between CUDA events; times in ms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tracea.errors import CompilationError, InvalidArgumentError, LaunchError, UnsupportedConfigError
from tracea.usertune.runner import Launch

from . import toolkit


def _is_device_array(a: Any) -> bool:
    return hasattr(a, "__cuda_array_interface__") or (hasattr(a, "is_cuda") and bool(getattr(a, "is_cuda", False)))


class CudaRunner:
    """:class:`tracea.usertune.runner.KernelRunner` for CUDA C++ kernels on one GPU."""

    lang = "CUDA"
    returns_time = False

    def __init__(self, device: int | None) -> None:
        from tracea.doctor.doctor import get_doctor

        cp = toolkit.cupy()
        self.cp = cp
        self.index = int(device or 0)
        if not 0 <= self.index < toolkit.device_count():
            raise InvalidArgumentError("device", device, f"a CUDA device index below {toolkit.device_count()}")
        self.dev = cp.cuda.Device(self.index)
        props = cp.cuda.runtime.getDeviceProperties(self.index)
        name = props["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.max_threads = int(props["maxThreadsPerBlock"])
        self.max_smem = int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"]))
        self.profile = get_doctor().profile_for(f"cuda:{self.index}")
        with self.dev:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.start, self.end = cp.cuda.Event(), cp.cuda.Event()
        self._module: Any = None

    def environment(self) -> dict[str, str]:
        out = {f"cuda_{k}": v for k, v in toolkit.versions().items()}
        out["device_index"] = str(self.index)
        return out

    def prepare_arguments(self, arguments: Sequence[Any], inplace: bool = False) -> list[Any]:
        cp = self.cp
        out = []
        with self.dev:
            for i, a in enumerate(arguments):
                if isinstance(a, np.ndarray) or _is_device_array(a):
                    try:
                        host = a if isinstance(a, np.ndarray) else None
                        view = cp.asarray(a)
                        if inplace and host is None and view.flags.c_contiguous:
                            out.append([None, None, view])  # launch on the caller's memory
                            continue
                        dev = cp.array(view, copy=True, order="C")
                    except Exception as exc:  # noqa: BLE001 - an array CuPy cannot take
                        raise InvalidArgumentError(f"arguments[{i}]", a, f"an array CuPy accepts ({exc})") from None
                    out.append([host, None if inplace else dev.copy(), dev])
                elif isinstance(a, np.generic):
                    out.append([a, a, a])
                else:
                    raise InvalidArgumentError(f"arguments[{i}]", a, "an array (NumPy, CuPy, torch CUDA) or a NumPy scalar "
                                                                     "such as np.int32(n)")
        return out

    def compile(self, launch: Launch) -> Any:
        cp = self.cp
        opts = list(launch.compiler_options)
        if not any("-std=" in o for o in opts):
            opts = ["--std=c++11"] + opts
        if launch.smem_bytes > self.max_smem:
            raise UnsupportedConfigError(f"{launch.smem_bytes} B of shared memory exceed the device's {self.max_smem} B")
        with self.dev:
            try:
                module = cp.RawModule(code=launch.source, options=tuple(opts), name_expressions=[launch.name])
                fn = module.get_function(launch.name)
                for name, value in launch.cmem_args.items():
                    symbol = module.get_global(name)
                    arr = np.asarray(value.get() if hasattr(value, "get") else value)
                    cp.ndarray(arr.shape, arr.dtype, symbol)[...] = cp.asarray(arr)
            except Exception as exc:  # noqa: BLE001 - CompileException, CUDADriverError at load
                raise CompilationError(f"{launch.name} failed to compile or load", backend="cuda",
                                       log=str(exc)[-4000:]) from None
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            limit = int(getattr(fn, "max_threads_per_block", self.max_threads))
            if threads > limit:
                raise UnsupportedConfigError(f"{threads} threads per block exceed the {limit} this kernel can "
                                             f"launch with (registers)")
            if launch.smem_bytes > 48 * 1024:
                try:
                    fn.max_dynamic_shared_size_bytes = launch.smem_bytes
                except Exception as exc:  # noqa: BLE001
                    raise UnsupportedConfigError(f"cannot opt in to {launch.smem_bytes} B of shared memory: {exc}") from None
        self._module = module
        return fn

    def _args(self, args: list[Any]) -> tuple[Any, ...]:
        return tuple(cur for _, _, cur in args)

    def reset_arguments(self, args: list[Any]) -> None:
        with self.dev:
            for _, orig, cur in args:
                if orig is not None and not isinstance(cur, np.generic):
                    cur[...] = orig
            self.stream.synchronize()

    def _launch(self, kernel: Any, args: list[Any], launch: Launch) -> None:
        kernel(launch.grid, launch.block, self._args(args), stream=self.stream, shared_mem=launch.smem_bytes)

    def run(self, kernel: Any, args: list[Any], launch: Launch) -> None:
        with self.dev:
            try:
                self._launch(kernel, args, launch)
                self.stream.synchronize()
            except Exception as exc:  # noqa: BLE001 - CUDADriverError: resources, illegal address ...
                raise LaunchError(f"{launch.name} failed to launch: {exc}", backend="cuda") from None

    def benchmark(self, kernel: Any, args: list[Any], launch: Launch, iterations: int) -> list[float]:
        cp = self.cp
        times = []
        with self.dev:
            try:
                self._launch(kernel, args, launch)
                self.stream.synchronize()
                for _ in range(iterations):
                    self.start.record(self.stream)
                    self._launch(kernel, args, launch)
                    self.end.record(self.stream)
                    self.end.synchronize()
                    times.append(float(cp.cuda.get_elapsed_time(self.start, self.end)))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"{launch.name} failed while timing: {exc}", backend="cuda") from None
        return times

    def results(self, args: list[Any], only: Sequence[int] | None = None) -> list[Any]:
        with self.dev:
            return [cur if isinstance(cur, np.generic) else (self.cp.asnumpy(cur) if only is None or i in only else None)
                    for i, (_, _, cur) in enumerate(args)]

    def copy_back(self, args: list[Any]) -> None:
        with self.dev:
            for host, _, cur in args:
                if isinstance(host, np.ndarray) and host.flags.writeable:
                    host[...] = self.cp.asnumpy(cur).reshape(host.shape)

    def close(self) -> None:
        self._module = None


def runner(lang: str, device: Any, options: dict[str, Any]) -> Any:
    """The ``tracea_kernel_runner`` answer for ``"CUDA"`` and ``"TRITON"``."""
    if lang == "CUDA":
        return CudaRunner(device)
    if lang == "TRITON":
        from .triton_kernels import TritonRunner

        return TritonRunner(device)
    return None
