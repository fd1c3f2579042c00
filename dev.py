#!/usr/bin/env python3
"""Developer entry point for a fresh clone that has only Python and pip.

    python3 dev.py demo    # Doctor report, then real kernels tuned and run on the best backend present
    python3 dev.py test    # the whole test suite (what CI runs)
    python3 dev.py bench   # benchmark scripts of the backends present (slow; big shapes)
    python3 dev.py fuzz --minutes 20 --jobs 2   # fuzz tracea.ops (python -m tracea.fuzzing; docs/fuzzing.md)
    python3 dev.py env     # only create/refresh the virtual environment (.venv)

The first run creates ``.venv`` and installs every package of the monorepo in editable mode, with torch
pinned to the CPU build (ci/constraints.txt) so no CUDA wheels are downloaded. Later runs reuse it and
reinstall only when a pyproject or requirements file changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TRACEA_VENV", ROOT / ".venv"))
PACKAGES = ["tracea-core", "tracea-cpu", "tracea-opencl", "tracea-torch", "tracea-cuda"]
#: the ziglang wheel is an AArch64 cross compiler: CI compile-checks the NEON kernels with it.
OPTIONAL_TEST_TOOLS = ["ziglang"]
SETUP_SCRIPTS = [ROOT / "packages" / "tracea-opencl" / "ci" / "setup_opencl_runtime.sh"]


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp() -> str:
    h = hashlib.sha256()
    for p in sorted(ROOT.glob("packages/*/pyproject.toml")) + sorted((ROOT / "ci").glob("*.txt")):
        h.update(p.read_bytes())
    h.update(repr(OPTIONAL_TEST_TOOLS).encode())
    for s in SETUP_SCRIPTS:
        if s.exists():
            h.update(s.read_bytes())
    return h.hexdigest()


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)  # type: ignore[call-overload]


def ensure_env() -> Path:
    """Create or refresh the virtual environment; return its python."""
    stamp_file = VENV / ".tracea-stamp"
    py = _python()
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == _stamp():
        return py
    if not py.exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + ["--upgrade", "pip"])
    editable: list[object] = []
    for name in PACKAGES:
        editable += ["-e", ROOT / "packages" / name]
    _run(pip + ["-c", ROOT / "ci" / "constraints.txt", "-r", ROOT / "ci" / "requirements-test.txt"] + editable)
    # Optional test tools: a failed install (offline machine) only makes their tests skip with a reason.
    for extra in OPTIONAL_TEST_TOOLS:
        print(f"+ optional: pip install {extra}", flush=True)
        if subprocess.run([str(c) for c in pip + ["--retries", "1", "--timeout", "30", extra]]).returncode:
            print(f"  ({extra} unavailable: the tests that need it will skip)", flush=True)
    for script in SETUP_SCRIPTS:
        if script.exists():
            _run(["bash", script], env={**os.environ, "VIRTUAL_ENV": str(VENV), "PATH": f"{py.parent}:{os.environ['PATH']}"})
    stamp_file.write_text(_stamp())
    return py


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRACEA_PLUGINS", None)  # installed distributions provide entry points
    env.pop("TRACEA_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("PYTHONPATH", None)
    env_file = VENV / "tracea-env.sh"  # written by setup scripts: KEY=VALUE lines
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            line = line.strip()
            if line.startswith("export "):
                line = line[len("export "):]
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip().strip('"')
    return env


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "help"
    rest = argv[1:]
    if cmd == "env":
        ensure_env()
        return 0
    if cmd == "test":
        py = ensure_env()
        code = subprocess.run([str(py), "-m", "pytest", "-q", *rest], cwd=ROOT, env=_env()).returncode
        return 0 if code == 5 and rest else code  # 5: nothing collected by a user-narrowed selection
    if cmd == "demo":
        py = ensure_env()
        return subprocess.run([str(py), str(ROOT / "examples" / "demo.py"), *rest], cwd=ROOT, env=_env()).returncode
    if cmd == "fuzz":  # options: --cases --seed --minutes --device cpu|cuda --report --jobs --sanitize ...
        py = ensure_env()
        return subprocess.run([str(py), "-m", "tracea.fuzzing", *rest], cwd=ROOT, env=_env()).returncode
    if cmd == "bench":
        py = ensure_env()
        code = 0
        scripts = sorted(ROOT.glob("benchmarks/*/bench_*.py")) + sorted(ROOT.glob("packages/*/benchmarks/bench_*.py"))
        for script in scripts:
            print(f"\n=== {script.relative_to(ROOT)} ===", flush=True)
            code |= subprocess.run([str(py), str(script), *rest], cwd=ROOT, env=_env()).returncode
        return code
    print(__doc__)
    return 0 if cmd in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
