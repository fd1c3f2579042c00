"""torch's float32 math flags, read through torch's C getters where it has them.

Every plan key and patched-layer memo check reads them, so a Python frame (``torch.get_float32_matmul_precision``)
or a module descriptor (``torch.backends.cudnn.allow_tf32``) costs there; the public spellings stay as the
fallback for a torch without the private getters.
"""

from __future__ import annotations

from typing import Callable

import torch

#: ``torch.backends.cudnn.allow_tf32`` (what CUDA convolutions in float32 follow)
cudnn_allow_tf32: Callable[[], bool] = (getattr(torch._C, "_get_cudnn_allow_tf32", None)
                                        or (lambda: bool(torch.backends.cudnn.allow_tf32)))
#: ``torch.get_float32_matmul_precision()`` (``"highest"``, ``"high"`` = TF32, ``"medium"``)
matmul_precision: Callable[[], str] = (getattr(torch._C, "_get_float32_matmul_precision", None)
                                       or torch.get_float32_matmul_precision)

__all__ = ["cudnn_allow_tf32", "matmul_precision"]
