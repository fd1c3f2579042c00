"""The CUDA backend's kernel variants."""

from __future__ import annotations


def all_variants() -> list:
    from .attention import ATTENTION_VARIANTS  # noqa: PLC0415
    from .attention_decode import ATTENTION_DECODE_VARIANTS  # noqa: PLC0415
    from .attention_wgmma import ATTENTION_WGMMA_VARIANTS  # noqa: PLC0415
    from .gemm import GEMM_VARIANTS  # noqa: PLC0415
    from .conv import CONV_VARIANTS  # noqa: PLC0415
    from .depthwise import DEPTHWISE_VARIANTS  # noqa: PLC0415
    from .gemv import GEMV_VARIANTS  # noqa: PLC0415
    from .hopper import HOPPER_VARIANTS  # noqa: PLC0415
    from .hopper_conv import HOPPER_CONV_VARIANTS  # noqa: PLC0415
    from .hopper_fewrows import FEWROWS_VARIANTS  # noqa: PLC0415
    from .hopper_nchw1x1 import NCHW1X1_VARIANTS  # noqa: PLC0415
    from .pointwise import POINTWISE_VARIANTS  # noqa: PLC0415
    from .pooled import POOLED_VARIANTS  # noqa: PLC0415
    from .rows_fma import ROWS_FMA_VARIANTS  # noqa: PLC0415
    from .rows_kn import ROWS_KN_VARIANTS  # noqa: PLC0415
    from .skinny import SKINNY_VARIANTS  # noqa: PLC0415

    return [cls() for cls in GEMV_VARIANTS + SKINNY_VARIANTS + ROWS_FMA_VARIANTS + ROWS_KN_VARIANTS + FEWROWS_VARIANTS + HOPPER_VARIANTS + GEMM_VARIANTS + HOPPER_CONV_VARIANTS
            + POOLED_VARIANTS + NCHW1X1_VARIANTS + POINTWISE_VARIANTS + DEPTHWISE_VARIANTS + CONV_VARIANTS + ATTENTION_DECODE_VARIANTS + ATTENTION_WGMMA_VARIANTS + ATTENTION_VARIANTS]
