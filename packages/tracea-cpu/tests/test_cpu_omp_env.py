"""The OpenMP spin default (``tracea_cpu.omp_env``): set when the CPU plugin loads first, never over the
user's settings, never once a runtime is loaded (checked in fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")

PROBE = "import os, tracea_cpu.plugin; print(os.environ.get('GOMP_SPINCOUNT'))"


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "TRACEA_OMP_SPIN")}
    res = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_spin_default_set_when_tracea_loads_openmp_first():
    from tracea_cpu.omp_env import SPINCOUNT

    assert _run(PROBE) == SPINCOUNT


@pytest.mark.parametrize("env,expected", [({"GOMP_SPINCOUNT": "7"}, "7"), ({"OMP_WAIT_POLICY": "active"}, "None"),
                                          ({"TRACEA_OMP_SPIN": "default"}, "None")])
def test_user_settings_win(env, expected):
    assert _run(PROBE, **env) == expected


def test_not_set_once_a_runtime_is_loaded():
    pytest.importorskip("torch")
    code = "import torch, os\nfrom tracea_cpu.omp_env import libgomp_loaded\n" \
           "assert libgomp_loaded()\nimport tracea_cpu.plugin\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    assert _run(code) == "None"
