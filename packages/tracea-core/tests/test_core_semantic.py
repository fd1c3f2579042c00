"""Semantic IR: PipelineConfig validation against device profiles; SearchSpace building and pruning."""

from __future__ import annotations

import pytest

from tracea import BarrierMode, PipelineConfig, SearchSpace, SwizzleMode
from tracea.doctor.profile import DeviceProfile
from tracea.errors import InvalidArgumentError, UnsupportedConfigError
from tracea.gpuinfo import GPUInfo
from tracea.ir import Device

GPU = GPUInfo.h100().to_profile()


def test_config_roundtrip_and_params():
    c = PipelineConfig(128, 256, 64, stages=4, warps=12, swizzle="xor8", barrier=BarrierMode.ProducerConsumer,
                       params={"cluster": 2, "persistent": True})
    assert c.swizzle is SwizzleMode.XOR8 and c.get("cluster") == 2 and c.get("tile_m") == 128
    assert PipelineConfig.from_dict(c.to_dict()) == c
    assert c.replace(tile_k=32, cluster=1).key.startswith("tm128.tn256.tk32")
    assert c.with_params(cluster=1).get("cluster") == 1
    with pytest.raises(InvalidArgumentError, match="tile_m"):
        PipelineConfig(tile_m=0)
    with pytest.raises(InvalidArgumentError, match="swizzle"):
        PipelineConfig(swizzle="xor3")


def test_config_validation_reasons():
    ok = PipelineConfig(128, 128, 32, warps=8)
    assert ok.validate(GPU, smem_bytes=64 * 1024, regs_per_thread=128)
    too_many_threads = PipelineConfig(warps=64)
    v = too_many_threads.validate(GPU)
    assert not v and "2048 threads" in v.reason
    v = ok.validate(GPU, smem_bytes=300 * 1024)
    assert not v and "shared memory" in v.reason
    v = ok.validate(GPU, regs_per_thread=255 * 4)
    assert not v and "registers" in v.reason
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        ok.require_valid(GPU, smem_bytes=10**9)
    cpu = DeviceProfile(Device.cpu(), "cpu", max_threads_per_block=2)
    assert not PipelineConfig(warps=4).validate(cpu)


def test_search_space_seed_builder():
    space = (SearchSpace.new().tile_m([64, 128]).tile_n([64, 128]).tile_k([32]).stages([2, 3])
             .swizzles([SwizzleMode.NONE, SwizzleMode.Xor4])
             .barrier_modes([BarrierMode.NONE, BarrierMode.ProducerConsumer]))
    configs = list(space)
    assert len(configs) == space.cardinality == 32
    assert len(set(configs)) == 32
    assert all(space.contains(c) for c in configs)
    assert not space.contains(PipelineConfig(tile_m=256))


def test_search_space_constraints_and_params():
    space = (SearchSpace().tile_m([32, 64, 128]).param("mr", [4, 8])
             .where(lambda c: c.tile_m % (c.get("mr") * 8) == 0 or "tile_m must be a multiple of 8*mr"))
    kept = list(space)
    assert {(c.tile_m, c.get("mr")) for c in kept} == {(32, 4), (64, 4), (64, 8), (128, 4), (128, 8)}
    assert space.rejection(PipelineConfig(tile_m=32, params={"mr": 8})) == "tile_m must be a multiple of 8*mr"
    with pytest.raises(InvalidArgumentError):
        SearchSpace().tile_m([])
