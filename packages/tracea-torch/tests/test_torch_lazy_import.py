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


def test_numpy_calls_while_another_thread_imports_torch():
    """A NumPy call while torch is still being imported (``sys.modules`` already holds the partially
    initialized module, without ``torch.Tensor``): the adapters' "is this a torch tensor?" must not raise
    (it did, AttributeError, when the tuning cache's concurrency fuzz ran a tuner that imported torch in one
    thread beside ``tracea.ops.matmul`` in another). Deterministic form: a stand-in module marked as
    initializing sits in ``sys.modules``; then the real race, calls on a thread for the whole import."""
    code = ("import sys, types, importlib.machinery, threading, numpy as np, tracea, tracea.ops\n"
            "from tracea.runtime.arrays import imported\n"
            "from tracea.plugins.manager import get_plugin_manager\n"
            "assert 'torch' in [n for n, _ in get_plugin_manager().list_name_plugin()]  # plugins loaded first\n"
            "a = np.ones((16, 24), np.float32); b = np.ones((24, 8), np.float32)\n"
            "fake = types.ModuleType('torch'); fake.__spec__ = importlib.machinery.ModuleSpec('torch', None)\n"
            "fake.__spec__._initializing = True; sys.modules['torch'] = fake\n"
            "assert imported('torch') is None\n"
            "assert (tracea.ops.matmul(a, b) == 24).all() and (tracea.ops.matmul(b.T.copy(), a.T.copy()) == 24).all()\n"
            "from tracea.tuning.inputs import pick_adapter\n"
            "from tracea.ir.device import Device\n"
            "from tracea.dtypes import DType\n"
            "from tracea.runtime.arrays import builtin_adapters\n"
            "adapters = [x for r in get_plugin_manager().hook.tracea_array_adapters()\n"
            "            for x in (r if isinstance(r, (list, tuple)) else [r])] + list(builtin_adapters())\n"
            "assert pick_adapter(adapters, Device('cpu', 0), (DType.F32,)).name == 'numpy'  # tuning: NumPy inputs\n"
            "cuda = [x for x in adapters if 'cuda' in x.device_kinds]\n"
            "if any(x.name == 'cupy' for x in cuda):  # CUDA tuning of a CuPy program: CuPy inputs, bf16 through torch\n"
            "    assert pick_adapter(cuda, Device('cuda', 0), (DType.F16, DType.F32)).name == 'cupy'\n"
            "    assert pick_adapter(cuda, Device('cuda', 0), (DType.BF16,)).name == 'torch'\n"
            "del sys.modules['torch']\n"
            "errors, done = [], threading.Event()\n"
            "def calls():\n"
            "    while not done.is_set():\n"
            "        try:\n"
            "            assert (tracea.ops.matmul(a, b) == 24).all()\n"
            "        except Exception as exc:\n"
            "            errors.append(repr(exc)); return\n"
            "t = threading.Thread(target=calls); t.start()\n"
            "import torch\n"
            "done.set(); t.join()\n"
            "print(errors or 'ok', imported('torch') is torch)")
    assert _run(code) == "ok True"
