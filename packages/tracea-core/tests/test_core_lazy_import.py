"""The core imports, profiles the host and runs ops without importing cupy, pyopencl, torch or optuna,
and still works when they cannot be imported at all."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

HEAVY = ("cupy", "pyopencl", "torch", "optuna")


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["TRACEA_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["TRACEA_PLUGINS"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_core_does_not_import_heavy_toolkits():
    proc = _run("""
        import sys, numpy as np, tracea
        tracea.get_doctor().profiles(); tracea.get_doctor().variants()
        tracea.ops.matmul(np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))
        tracea.Context().synchronize()
        print(",".join(m for m in %r if m in sys.modules))
    """ % (HEAVY,))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_core_works_when_toolkits_are_unimportable():
    proc = _run("""
        import sys
        for m in %r + ("tracea_torch",):
            sys.modules[m] = None  # any import of these raises ImportError
        import numpy as np, tracea
        out = tracea.ops.conv2d(np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), padding=1)
        assert out.shape == (1, 3, 5, 5)
        try:
            tracea.patch_conv2d
        except ImportError as exc:
            assert "pip install tracea-torch" in str(exc)
        else:
            raise AssertionError("patch_conv2d must explain what to install")
        print("ok")
    """ % (HEAVY,))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
