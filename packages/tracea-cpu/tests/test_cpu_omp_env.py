"""The OpenMP spin default (``tracea_cpu.omp_env``): set when the CPU plugin loads first in an environment
without torch (which would share the runtime), never over the user's settings, never once a runtime is
loaded (checked in fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")

PROBE = "import os, tracea_cpu.plugin; print(os.environ.get('GOMP_SPINCOUNT'))"
#: the same in an environment where torch is not installed
NO_TORCH = ("import os, tracea_cpu.omp_env as o\no._torch_installed = lambda: False\n"
            "import tracea_cpu.plugin; print(os.environ.get('GOMP_SPINCOUNT'))")


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "TRACEA_OMP_SPIN")}
    res = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_spin_default_set_when_tracea_loads_openmp_first_without_torch():
    from tracea_cpu.omp_env import SPINCOUNT

    assert _run(NO_TORCH) == SPINCOUNT


def test_never_set_where_torch_would_share_the_runtime():
    """torch imported after Tracea's first kernel shares libgomp and its settings: with the short spin its
    small calls ran up to 9x slower on a quiet machine, so Tracea leaves the runtime alone when torch is
    installed (unless asked: TRACEA_OMP_SPIN=short)."""
    from tracea_cpu.omp_env import SPINCOUNT

    pytest.importorskip("torch")
    assert _run(PROBE) == "None"
    assert _run(PROBE, TRACEA_OMP_SPIN="short") == SPINCOUNT


@pytest.mark.parametrize("env,expected", [({"GOMP_SPINCOUNT": "7"}, "7"), ({"OMP_WAIT_POLICY": "active"}, "None"),
                                          ({"TRACEA_OMP_SPIN": "default"}, "None")])
def test_user_settings_win(env, expected):
    assert _run(NO_TORCH, **env) == expected


def test_not_set_once_a_runtime_is_loaded():
    pytest.importorskip("torch")
    code = "import torch, os\nfrom tracea_cpu.omp_env import libgomp_loaded\n" \
           "assert libgomp_loaded()\nimport tracea_cpu.plugin\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    assert _run(code) == "None"


def test_doctor_advises_on_openblas_spinning(monkeypatch):
    from tracea_cpu.omp_env import blas_pool_advice

    maps = "7f00-7f01 r-xp 0 0:0 0 /venv/numpy.libs/libscipy_openblas64_-6bb31eeb.so\\n"
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    assert "set OPENBLAS_THREAD_TIMEOUT=4" in blas_pool_advice(maps)
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "4")
    assert blas_pool_advice(maps) == "OpenBLAS loaded, OPENBLAS_THREAD_TIMEOUT=4"
    assert blas_pool_advice("7f00-7f01 r-xp 0 0:0 0 /usr/lib/libm.so.6\\n") == "no OpenBLAS loaded"
    assert isinstance(blas_pool_advice(), str)  # this process's own maps
