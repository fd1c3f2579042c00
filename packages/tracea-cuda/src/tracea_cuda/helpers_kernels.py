"""The small helper kernels the GEMM/conv/attention variants launch beside their main kernel (transposes,
the 3xTF32 split, the split-K reduction, a boolean attention mask's bit packing), loaded once per (kind,
arguments, device) and then a dict lookup: rendering and hashing a source costs more than a small conv's
whole launch."""

from __future__ import annotations

import functools

from tracea.dtypes import DType
from tracea.ir.epilogue import Epilogue

from . import compiler, toolkit
from .emit import flash_wgmma, pad, split, splitk, transpose


def _device() -> int:
    return int(toolkit.cupy().cuda.runtime.getDevice())


def transposer(dtype: DType, arch: str, pair: bool = False, round_tf32: bool = False) -> compiler.Kernel:
    """The batched 2-D transpose for ``dtype`` on the current device (``pair``: two transposes in one
    launch, see :func:`launcher.pair_launch`; ``round_tf32``: values written rounded to TF32, for a Hopper
    TF32 kernel, see :func:`emit.transpose.render`)."""
    return _transposer(dtype, arch, _device(), pair, round_tf32)


@functools.lru_cache(maxsize=64)
def _transposer(dtype: DType, arch: str, dev: int, pair: bool, round_tf32: bool = False) -> compiler.Kernel:
    name = transpose.PAIR_NAME if pair else transpose.KERNEL_NAME
    return compiler.load(transpose.render(dtype, round_tf32), name, arch, smem=0, threads=256)


def padder(dtype: DType, arch: str) -> compiler.Kernel:
    """The two-job channel pad (:mod:`emit.pad`) for ``dtype`` on the current device."""
    return _padder(dtype.storage, arch, _device())


@functools.lru_cache(maxsize=16)
def _padder(dtype: DType, arch: str, dev: int) -> compiler.Kernel:
    return compiler.load(pad.render(dtype), pad.PAIR_NAME, arch, smem=0, threads=256)


def pitcher(dtype: DType, arch: str) -> compiler.Kernel:
    """The row pitch copy (:func:`emit.pad.render_pitch`) for ``dtype`` on the current device."""
    return _pitcher(dtype.storage, arch, _device())


@functools.lru_cache(maxsize=16)
def _pitcher(dtype: DType, arch: str, dev: int) -> compiler.Kernel:
    return compiler.load(pad.render_pitch(dtype), pad.PITCH_NAME, arch, smem=0, threads=256)


def splitter(arch: str, pair: bool = False) -> compiler.Kernel:
    """The 3xTF32 operand split on the current device (``pair``: both operands in one launch)."""
    return _splitter(arch, _device(), pair)


@functools.lru_cache(maxsize=16)
def _splitter(arch: str, dev: int, pair: bool) -> compiler.Kernel:
    return compiler.load(split.render(), split.PAIR_NAME if pair else split.KERNEL_NAME, arch, smem=0, threads=256)


def reducer(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int, nchw_pq: int,
            arch: str) -> compiler.Kernel:
    """The split-K reduction (with the epilogue) on the current device."""
    return _reducer(dtype_out, bias_dtype, epilogue, splits, nchw_pq, arch, _device())


@functools.lru_cache(maxsize=256)
def _reducer(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int, nchw_pq: int, arch: str,
             dev: int) -> compiler.Kernel:
    src = splitk.render(dtype_out, bias_dtype, epilogue, splits, nchw_pq)
    return compiler.load(src, splitk.KERNEL_NAME, arch, smem=0, threads=256)


def wide_reducer(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int, arch: str) -> compiler.Kernel:
    """The split-K reduction for many slices over few outputs (:func:`emit.splitk.render_wide`; blocks of 32 x 8
    threads) on the current device."""
    return _wide_reducer(dtype_out, bias_dtype, epilogue, splits, arch, _device())


@functools.lru_cache(maxsize=64)
def _wide_reducer(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int, arch: str,
                  dev: int) -> compiler.Kernel:
    src = splitk.render_wide(dtype_out, bias_dtype, epilogue, splits)
    return compiler.load(src, splitk.WIDE_NAME, arch, smem=0, threads=32 * splitk.WIDE_GROUPS)


def mask_bits() -> compiler.Kernel:
    """The boolean-mask bit packer of the Hopper attention kernel (``flash_wgmma.render_mask_bits``) on the
    current device."""
    return _mask_bits(_device())


@functools.lru_cache(maxsize=8)
def _mask_bits(dev: int) -> compiler.Kernel:
    return compiler.load(flash_wgmma.render_mask_bits(), flash_wgmma.MASK_BITS_NAME, "sm_90a", smem=0,
                         threads=flash_wgmma.MASK_BITS_THREADS)
