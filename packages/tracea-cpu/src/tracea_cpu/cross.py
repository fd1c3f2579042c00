"""Cross-building the AArch64 (NEON) kernels on another machine, so they are compile-checked (and, with
qemu user emulation, run) where no Arm CPU exists.

Cross compiler, first found: ``$TRACEA_AARCH64_CC`` (a command line, e.g.
``python -m ziglang cc -target aarch64-linux-musl``), ``zig cc -target aarch64-linux-musl``, the
``ziglang`` wheel in this Python, ``aarch64-linux-gnu-gcc``, ``clang --target=aarch64-linux-gnu``.
Runner: ``$TRACEA_AARCH64_RUNNER`` or ``qemu-aarch64`` / ``qemu-aarch64-static`` on PATH.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CROSS_FLAGS = ("-O3", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Werror",
               "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-but-set-variable")
_PROBE = "#include <arm_neon.h>\nfloat32x4_t tr_probe(float32x4_t a) { return vfmaq_f32(a, a, a); }\n"
_PROBE_MAIN = "#include <stdio.h>\nint main(void) { puts(\"ok\"); return 0; }\n"


@dataclass(frozen=True)
class CrossCompiler:
    """An AArch64 C compiler command; ``links`` says whether it can also link static executables."""

    command: tuple[str, ...]
    links: bool

    def compile(self, source: str, out: Path, extra: tuple[str, ...] = (), link: bool = False) -> tuple[bool, str]:
        """Compile ``source`` to an object (or a static executable when ``link``); (ok, compiler output)."""
        src = out.with_suffix(".c")
        src.write_text(source)
        cmd = [*self.command, *CROSS_FLAGS, *extra, str(src), "-o", str(out)]
        cmd += ["-static", "-lm"] if link else ["-c"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{shlex.join(cmd)}: {exc}"
        return res.returncode == 0, shlex.join(cmd) + "\n" + res.stdout + res.stderr


def _candidates() -> list[tuple[str, ...]]:
    env = os.environ.get("TRACEA_AARCH64_CC")
    if env:
        return [tuple(shlex.split(env))]
    out: list[tuple[str, ...]] = []
    if shutil.which("zig"):
        out.append(("zig", "cc", "-target", "aarch64-linux-musl"))
    if importlib.util.find_spec("ziglang") is not None:
        out.append((sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl"))
    if shutil.which("aarch64-linux-gnu-gcc"):
        out.append(("aarch64-linux-gnu-gcc",))
    if shutil.which("clang"):
        out.append(("clang", "--target=aarch64-linux-gnu"))
    return out


@functools.lru_cache(maxsize=1)
def find_cross_compiler() -> CrossCompiler | str:
    """The first candidate that compiles NEON intrinsics, or a string saying what was tried."""
    tried = []
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in _candidates():
            cc = CrossCompiler(cmd, links=False)
            ok, log = cc.compile(_PROBE, Path(tmp) / "probe.o")
            if not ok:
                tried.append(f"{shlex.join(cmd)}: {log.strip().splitlines()[-1] if log.strip() else 'failed'}")
                continue
            links, _ = cc.compile(_PROBE_MAIN, Path(tmp) / "probe", link=True)
            return CrossCompiler(cmd, links=links)
    return ("no AArch64 cross compiler (tried: " + ("; ".join(tried) or "none found") +
            "); set $TRACEA_AARCH64_CC or `pip install ziglang`")


def find_runner() -> tuple[str, ...] | None:
    """A command that runs AArch64 Linux executables here (qemu user emulation), or None."""
    env = os.environ.get("TRACEA_AARCH64_RUNNER")
    if env:
        return tuple(shlex.split(env))
    for name in ("qemu-aarch64", "qemu-aarch64-static"):
        path = shutil.which(name)
        if path:
            return (path,)
    return None
