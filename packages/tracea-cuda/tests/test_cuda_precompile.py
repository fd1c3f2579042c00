"""``tracea_cuda.compiler.precompile``: fills the disk cache :func:`compiler.load` reads, compiling only on a
miss (CPU-only: NVRTC is stubbed)."""

from __future__ import annotations

from tracea_cuda import compiler


def test_precompile_writes_the_entry_load_reads_and_skips_a_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEA_CUDA_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_nvrtc(source, options, name):  # noqa: ANN001, ANN202
        calls.append((name, options))
        return b"cubin:" + source.encode()

    monkeypatch.setattr(compiler, "_nvrtc_cubin", fake_nvrtc)
    src = 'extern "C" __global__ void k0(float* x) { x[threadIdx.x] *= 2.0f; }'
    assert compiler.precompile(src, "k0", "sm_90a") is True
    options = compiler.options_for("sm_90a")
    path = tmp_path / f"{compiler.cache_key(src, options, 'sm_90a')}.cubin"
    assert path.read_bytes() == b"cubin:" + src.encode() and calls == [("k0", options)]
    assert compiler.precompile(src, "k0", "sm_90a") is False and len(calls) == 1  # a hit compiles nothing
    assert compiler.precompile(src, "k0", "sm_80") is True and len(calls) == 2  # another arch is another entry
