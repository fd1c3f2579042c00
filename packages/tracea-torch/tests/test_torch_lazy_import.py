"""Loading the plugin does not import torch: a NumPy program calling ``tracea.ops`` with tracea-torch
installed never pays for torch (nor loads its OpenMP runtime, which decides whether the CPU backend uses its
own worker pool); ``tracea_torch``'s names import it on first use; with torch imported first, importing
``tracea_torch`` registers the custom ops at once, as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_numpy_program_does_not_import_torch():
    code = ("import sys, numpy as np, tracea, tracea.ops\n"
            "a = np.ones((8, 8), np.float32)\n"
            "assert (tracea.ops.matmul(a, a) == 8).all()\n"
            "import tracea.plugins.manager as m; names = [n for n, _ in m.get_plugin_manager().list_name_plugin()]\n"
            "print('torch' in names, 'torch' in sys.modules)\n"
            "import tracea_torch\n"
            "print('torch' in sys.modules, tracea_torch.patch_linear.__name__, 'torch' in sys.modules)")
    first, second = _run(code).splitlines()
    assert first == "True False", first  # the torch plugin loaded, torch not imported
    assert second == "False patch_linear True", second


def test_torch_first_registers_ops_on_import():
    code = "import torch, tracea_torch\nprint(hasattr(torch.ops.tracea, 'linear'), 'patch_linear' in vars(tracea_torch))"
    assert _run(code) == "True True"


def test_unknown_name_is_an_attribute_error():
    import tracea_torch

    with pytest.raises(AttributeError, match="no_such_name"):
        tracea_torch.no_such_name  # noqa: B018
    assert "patch_conv2d" in dir(tracea_torch)
