"""docs/plugin-guide.md section 3's code runs as written: imports resolve, and the variant it defines
serves, rejects, enumerates, validates and computes as the guide says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tracea import GemmOp
from tracea.doctor import Doctor
from tracea.doctor.variant import OpArgs
from tracea.ir.device import Device
from tracea.plugins import create_plugin_manager
from tracea.runtime.arrays import NumpyAdapter
from tracea.testing import output_error

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "plugin-guide.md"


def _section3_namespace() -> dict:
    text = GUIDE.read_text()
    section = text[text.index("## 3. Variants"):text.index("## 3b.")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    ns: dict = {"__name__": "section3_example"}
    exec(compile(code, str(GUIDE) + ":section3", "exec"), ns)
    return ns


def test_section3_variant_behaves_as_documented(rng):
    variant = _section3_namespace()["MyGemm"]()
    doctor = Doctor(create_plugin_manager(autoload=False, blocked=[]))
    cpu = doctor.profile_for(Device.cpu())
    op = GemmOp(48, 40, 32, epilogue="bias+relu")
    assert variant.check(op, cpu) == []
    reasons = variant.check(GemmOp(8, 8, 8, batch=2, epilogue="gelu"), cpu)
    assert any("batched" in r for r in reasons) and any("gelu" in r for r in reasons)
    space = variant.search_space(op, cpu)
    assert space.cardinality > 0 and all(c.tile_m * c.tile_n <= 8192 for c in space)
    assert all(c.get("unroll") in (1, 2, 4) for c in space)
    hero = variant.hero_configs(op, cpu)[0]
    assert hero.get("unroll") == 2 and variant.validate_config(op, hero, cpu)
    assert not variant.validate_config(GemmOp(8, 8, 9), hero, cpu)
    a = rng.standard_normal((48, 32), dtype=np.float32)
    b = rng.standard_normal((32, 40), dtype=np.float32)
    bias = rng.standard_normal(40, dtype=np.float32)
    out = np.zeros((48, 40), np.float32)
    variant.run(op, hero, OpArgs({"a": a, "b": b, "bias": bias}, out, NumpyAdapter()), cpu)
    assert output_error(op, out, dict(a=a, b=b, bias=bias)) < 1e-6
