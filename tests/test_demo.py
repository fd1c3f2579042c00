"""The README's main job runs end to end (quick mode) and every kernel it runs matches the reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_quick_runs_and_checks_results(tmp_path):
    env = dict(os.environ)
    env["TRACEA_CACHE_DIR"] = str(tmp_path)  # keep the user's tuning cache untouched
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip().startswith(("OK", "BAD"))]
    assert len(lines) == 3, proc.stdout[-3000:]
    assert all(line.strip().startswith("OK") for line in lines), "\n".join(lines)
    assert "Devices" in proc.stdout and "Kernel variants" in proc.stdout
