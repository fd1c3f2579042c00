"""Runner for user OpenCL kernels (``tracea.tune_kernel(..., lang="OpenCL")``) through pyopencl.

Like Kernel Tuner's OpenCL backend: ``platform`` and ``device`` index the platforms and the devices
of that platform; the instance source is built with the user's ``compiler_options``; the global size
is ``grid * block`` per axis and the local size the block. Arrays are copied to device buffers (the
caller's arrays are never written), scalars are NumPy scalars. ``smem_args`` is not supported (use
``__local`` arrays sized by the defines). Times come from OpenCL profiling events, in ms.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from tracea.errors import CompilationError, InvalidArgumentError, LaunchError, UnsupportedConfigError
from tracea.ir.device import Device
from tracea.usertune.runner import Launch

from . import runtime


class OpenCLRunner:
    """:class:`tracea.usertune.runner.KernelRunner` for OpenCL C kernels on one device."""

    lang = "OPENCL"
    returns_time = False

    def __init__(self, device: int | None, platform: int) -> None:
        from tracea.doctor.doctor import get_doctor

        pairs = runtime.devices()
        if not pairs:
            from tracea.errors import UnsupportedDeviceError

            raise UnsupportedDeviceError(f"no OpenCL device: {runtime.status().reason}")
        platforms: list[Any] = []
        for p, _ in pairs:
            if all(p.int_ptr != q.int_ptr for q in platforms):
                platforms.append(p)
        if not 0 <= platform < len(platforms):
            raise InvalidArgumentError("platform", platform, f"an OpenCL platform index below {len(platforms)}")
        mine = [i for i, (p, _) in enumerate(pairs) if p.int_ptr == platforms[platform].int_ptr]
        index = int(device or 0)
        if not 0 <= index < len(mine):
            raise InvalidArgumentError("device", device, f"a device index below {len(mine)} on platform {platform}")
        self.tracea_device = Device.opencl(mine[index])
        self.cl = runtime.cl()
        self.cl_dev = pairs[mine[index]][1]
        self.ctx = self.cl.Context([self.cl_dev])
        self.queue = self.cl.CommandQueue(self.ctx, self.cl_dev,
                                          properties=self.cl.command_queue_properties.PROFILING_ENABLE)
        self.device_name = self.cl_dev.name.strip()
        self.max_threads = int(self.cl_dev.max_work_group_size)
        self.profile = get_doctor().profile_for(self.tracea_device)

    def environment(self) -> dict[str, str]:
        return {"opencl_driver": str(self.cl_dev.driver_version), "opencl_platform": self.cl_dev.platform.name.strip()}

    def prepare_arguments(self, arguments: Sequence[Any], inplace: bool = False) -> list[Any]:
        mf = self.cl.mem_flags
        out = []
        for i, a in enumerate(arguments):
            if isinstance(a, np.ndarray):
                host = np.array(a, order="C", copy=True)
                buf = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host) if host.nbytes else None
                if buf is None:
                    raise InvalidArgumentError(f"arguments[{i}]", a, "a non-empty array")
                out.append([host, buf, a])
            elif isinstance(a, np.generic):
                out.append([a, a, a])
            else:
                raise InvalidArgumentError(f"arguments[{i}]", a, "a NumPy array or a NumPy scalar such as np.int32(n)")
        return out

    def compile(self, launch: Launch) -> Any:
        if launch.smem_bytes:
            raise UnsupportedConfigError("smem_args is not supported for OpenCL kernels")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pyopencl's CompilerWarning for any build log
                program = self.cl.Program(self.ctx, launch.source).build(options=list(launch.compiler_options))
            kernel = getattr(program, launch.name)
        except Exception as exc:  # noqa: BLE001 - RuntimeError / LogicError with the build log
            raise CompilationError(f"{launch.name} failed to build", backend="opencl", log=str(exc)[-4000:]) from None
        try:
            wg = kernel.get_work_group_info(self.cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_dev)
        except Exception:  # noqa: BLE001
            wg = self.max_threads
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        if threads > wg:
            raise UnsupportedConfigError(f"{threads} work items per group exceed this kernel's limit {wg}")
        return kernel

    def reset_arguments(self, args: list[Any]) -> None:
        for host, cur, _ in args:
            if isinstance(host, np.ndarray):
                self.cl.enqueue_copy(self.queue, cur, host)
        self.queue.finish()

    def _launch(self, kernel: Any, args: list[Any], launch: Launch) -> Any:
        glob = tuple(g * b for g, b in zip(launch.grid, launch.block))
        return kernel(self.queue, glob, tuple(launch.block), *[cur for _, cur, _ in args])

    def run(self, kernel: Any, args: list[Any], launch: Launch) -> None:
        try:
            self._launch(kernel, args, launch).wait()
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"{launch.name} failed to launch: {exc}", backend="opencl") from None

    def benchmark(self, kernel: Any, args: list[Any], launch: Launch, iterations: int) -> list[float]:
        try:
            self._launch(kernel, args, launch).wait()
            times = []
            for _ in range(iterations):
                ev = self._launch(kernel, args, launch)
                ev.wait()
                times.append((ev.profile.end - ev.profile.start) * 1e-6)
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"{launch.name} failed while timing: {exc}", backend="opencl") from None
        return times

    def results(self, args: list[Any], only: Sequence[int] | None = None) -> list[Any]:
        out: list[Any] = []
        for i, (host, cur, _) in enumerate(args):
            if isinstance(host, np.ndarray) and only is not None and i not in only:
                out.append(None)
            elif isinstance(host, np.ndarray):
                res = np.empty_like(host)
                self.cl.enqueue_copy(self.queue, res, cur)
                out.append(res)
            else:
                out.append(cur)
        self.queue.finish()
        return out

    def copy_back(self, args: list[Any]) -> None:
        for (_host, _, user), res in zip(args, self.results(args)):
            if isinstance(user, np.ndarray) and user.flags.writeable:
                user[...] = res.reshape(user.shape)

    def close(self) -> None:
        self.queue.finish()


def runner(lang: str, device: Any, options: dict[str, Any]) -> OpenCLRunner | None:
    """The ``tracea_kernel_runner`` answer for ``"OPENCL"``."""
    if lang != "OPENCL":
        return None
    return OpenCLRunner(device, int(options.get("platform") or 0))
