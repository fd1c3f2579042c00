"""Built-in plugin registering the NumPy reference backend."""

from __future__ import annotations

from .._version import __version__
from ..plugins.backend_info import BackendInfo
from ..plugins.manager import hookimpl
from .blas import ReferenceBlasGemm
from .variants import VARIANTS


@hookimpl
def tracea_backend_info() -> BackendInfo:
    return BackendInfo(name="reference", version=__version__, package="tracea-core",
                       details={"role": "NumPy float64 oracle and last fallback; GEMM through NumPy's BLAS"})


@hookimpl
def tracea_register_variants() -> list:
    return [*VARIANTS, ReferenceBlasGemm()]
