"""Why tracea_cuda/compiler.py calls NVRTC itself (docs/backends/cuda.md, "Caches"): measures, without a
GPU (NVRTC only), the compile time of rendered Tracea kernels with Tracea's options and with the
``-ftz=true`` that CuPy's ``compile_with_cache`` (behind ``RawModule``) appends, whether the cubins
differ, and the cost of a disk-cache hit (read of the cached cubin).

    python benchmarks/cuda/probe_compile_cache.py [--arch sm_90a]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tracea.ir.ops import GemmOp
from tracea_cuda import compiler
from tracea_cuda.emit import mma, wgmma
from tracea_cuda.variants import all_variants


def _profile(arch: str):
    from tracea.doctor.profile import DeviceProfile
    from tracea.ir.device import Device
    from tracea_cuda.device import isa_flags

    cc = (9, 0) if arch == "sm_90a" else (8, 0)
    return DeviceProfile(Device("cuda", 0), f"offline {arch}", backend="cuda", arch=arch, compute_units=132,
                         compute_capability=cc, warp_size=32, max_threads_per_block=1024,
                         shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags(cc))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    profile = _profile(args.arch)
    op = GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu")
    want = "cuda.gemm.wgmma" if args.arch == "sm_90a" else "cuda.gemm.mma_f16"
    variant = next(v for v in all_variants() if v.name == want)
    config = variant.hero_configs(op, profile)[0]
    render = wgmma.render if ".wgmma" in want else mma.render
    source = render(variant.spec(op, config, None), name="k0")
    opts = compiler.options_for(args.arch)
    rows = []
    for label, options in (("tracea options", opts), ("+ -ftz=true (CuPy)", opts + ("-ftz=true",))):
        t0 = time.perf_counter()
        cubin = compiler._nvrtc_cubin(source, options, "k0")
        rows.append((label, time.perf_counter() - t0, cubin))
    plain_arch = None
    if args.arch.endswith("a"):  # what CuPy derives from the device: compute capability digits, no "a"
        plain = tuple(o if not o.startswith("-arch=") else "-arch=" + args.arch[:-1] for o in opts)
        try:
            compiler._nvrtc_cubin(source, plain, "k0")
            plain_arch = "compiles"
        except Exception as exc:  # noqa: BLE001 - CompilationError with NVRTC's log
            plain_arch = "fails: " + next((ln.strip() for ln in str(exc).splitlines() if "error" in ln), str(exc))[:160]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        from tracea.fileio import write_atomic

        t0 = time.perf_counter()
        write_atomic(path, rows[0][2])
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            path.read_bytes()
        t_read = (time.perf_counter() - t0) / 20
    print(f"{want} hero {config.key} for {args.arch}, source {len(source)} chars")
    for label, t, cubin in rows:
        print(f"  NVRTC compile, {label:<20} {t * 1e3:8.1f} ms  cubin {len(cubin)} B")
    print(f"  cubins identical with and without -ftz=true: {rows[0][2] == rows[1][2]}")
    if plain_arch is not None:
        print(f"  the same source for -arch={args.arch[:-1]} (no arch-specific suffix): {plain_arch}")
    print(f"  disk cache: write {t_write * 1e3:.2f} ms, hit (read) {t_read * 1e3:.3f} ms "
          f"= {rows[0][1] / t_read:.0f}x cheaper than compiling")


if __name__ == "__main__":
    main()
