"""The toolchain and the plugin: compile errors carry the compiler log, a missing compiler makes the
backend and its variants unavailable with the reason, the disk cache is reused, hooks register."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tracea.errors import CompilationError
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea_cpu import plugin, toolchain
from tracea_cpu.testing import BEST, HAVE_CC, PROFILE

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")


@needs_cc
def test_compile_error_raises_compilation_error_with_log(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEA_CPU_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompilationError) as info:
        toolchain.build("int broken(void) { return undefined_symbol_xyz; }\n", (), "broken")
    assert "undefined_symbol_xyz" in info.value.log
    assert info.value.backend == "cpu"
    assert not list(tmp_path.glob("*.so")), "a failed build must leave no object behind"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.c"))


@needs_cc
def test_build_caches_on_disk_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEA_CPU_CACHE_DIR", str(tmp_path))
    src = "int tr_answer(void) { return 42; }\n"
    lib = toolchain.build(src, (), "answer")
    assert lib.tr_answer() == 42
    objects = list(tmp_path.glob("answer-*.so"))
    assert len(objects) == 1
    stamp = objects[0].stat().st_mtime_ns
    # A fresh process finds the cached object instead of compiling again.
    code = ("import sys; from tracea_cpu import toolchain; "
            f"lib = toolchain.build({src!r}, (), 'answer'); sys.exit(0 if lib.tr_answer() == 42 else 1)")
    env = dict(os.environ, TRACEA_CPU_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert objects[0].stat().st_mtime_ns == stamp
    assert len(list(tmp_path.glob("answer-*.so"))) == 1


@needs_cc
def test_builds_from_threads_compile_each_object_once_and_in_parallel(tmp_path, monkeypatch):
    """Different objects compile at the same time (the arbiter's second chance builds its alternatives in
    worker threads); threads asking for the same object wait for one compilation."""
    import threading
    import time

    monkeypatch.setenv("TRACEA_CPU_CACHE_DIR", str(tmp_path))
    compiled, busy, most = [], [0], [0]
    real = toolchain._compile
    lock = threading.Lock()

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.2)  # (hold the slot long enough for the other thread to arrive)
        try:
            compiled.append(args[-1])
            return real(*args, **kwargs)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(toolchain, "_compile", counting)
    results: dict[str, int] = {}

    def build(value: int, key: str) -> None:
        lib = toolchain.build(f"int tr_value(void) {{ return {value}; }}\n", (), f"value{value}")
        results[key] = lib.tr_value()

    threads = [threading.Thread(target=build, args=(v, k)) for v, k in ((7, "a"), (8, "b"), (7, "c"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": 7, "b": 8, "c": 7}
    assert len(compiled) == 2 and most[0] == 2, "two objects compiled at once, the shared one once"


def test_no_compiler_makes_backend_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TRACEA_CPU_CACHE_DIR", str(tmp_path / "empty-cache"))
    info = plugin.tracea_backend_info()
    assert info.available is False
    assert "no C compiler" in info.reason and "no-such-cc" in info.reason
    variants = plugin.tracea_register_variants()
    ops = {"gemm": GemmOp(8, 8, 8), "conv2d": Conv2dOp(1, 2, 5, 5, 3, 3, 3), "attention": AttentionOp(1, 1, 4, 4, 8)}
    for v in variants:
        if v.isa.name != BEST:
            continue
        reasons = v.check(ops[v.op_kind.value], PROFILE)
        assert any("no C compiler" in r for r in reasons), (v.name, reasons)
    assert plugin.tracea_environment(PROFILE) == {"cpu_compiler": "none"}


@needs_cc
def test_plugin_registers_variants_per_isa():
    info = plugin.tracea_backend_info()
    assert info.available and info.details["compiler"]
    names = {v.name for v in plugin.tracea_register_variants()}
    for op in ("gemm", "conv2d", "attention"):
        for isa in ("avx512", "avx2", "neon", "scalar"):
            assert f"cpu.{op}.{isa}" in names
    env = plugin.tracea_environment(PROFILE)
    assert env and env["cpu_compiler"]


@needs_cc
def test_estimates_prefer_the_widest_isa():
    op = GemmOp(1024, 1024, 1024)
    runnable = [v for v in plugin.tracea_register_variants()
                if v.op_kind.value == "gemm" and not v.check(op, PROFILE)]
    assert runnable, "some CPU GEMM variant must run here"
    best = min(runnable, key=lambda v: (v.estimate_seconds(op, PROFILE), -v.priority))
    assert best.isa.name == BEST
    scalar = next(v for v in runnable if v.isa.name == "scalar")
    assert scalar.estimate_seconds(op, PROFILE) > best.estimate_seconds(op, PROFILE)


@needs_cc
def test_search_space_and_heroes_are_valid():
    for v in plugin.tracea_register_variants():
        if v.check(GemmOp(8, 8, 8), PROFILE) and v.check(AttentionOp(1, 1, 4, 4, 8), PROFILE) \
                and v.check(Conv2dOp(1, 2, 5, 5, 3, 3, 3), PROFILE):
            continue
        op = {"gemm": GemmOp(256, 256, 256), "conv2d": Conv2dOp(1, 16, 14, 14, 16, 3, 3, padding=1),
              "attention": AttentionOp(1, 2, 64, 64, 32)}[v.op_kind.value]
        heroes = v.hero_configs(op, PROFILE)
        assert heroes and all(v.validate_config(op, c, PROFILE) for c in heroes), v.name
        space = v.search_space(op, PROFILE)
        configs = list(space)
        assert configs, v.name
        assert all(v.validate_config(op, c, PROFILE) for c in configs[:50]), v.name
