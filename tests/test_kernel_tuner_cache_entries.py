"""User-kernel entries in Tracea's tuning cache pass the cache-file validation; corrupt ones are rejected."""

from __future__ import annotations

import json

from tracea.semantic.config import PipelineConfig
from tracea.tuning import cache_schema
from tracea.tuning.cache import TuningCache
from tracea.usertune import store
from tracea.usertune.space import from_config, to_config


def _entry(tmp_path):
    from tracea.doctor.doctor import get_doctor

    cache = TuningCache(tmp_path / "c.json")
    profile = get_doctor().profile_for("cpu")
    op = store.op_for("C", "saxpy", (1024, 1, 1), [], {"CC Version": "g++ 12"}, source="src",
                      tune_params={"unroll": [1, 2]})
    variant = store.variant_for("C", "saxpy")
    config = to_config({"unroll": 2, "warps": 3, "name": "fast", "ratio": 0.5, "flag": True})
    assert store.record(cache, op, variant, profile, config, [1e-3, 1.1e-3, 0.9e-3], trials=5)
    return cache, op, variant, profile


def test_user_entries_round_trip_and_validate(tmp_path):
    cache, op, variant, profile = _entry(tmp_path)
    raw = json.loads((tmp_path / "c.json").read_text())
    (key, entry), = raw["entries"].items()
    assert cache_schema.entry_problem(key, entry) is None
    e = store.lookup(TuningCache(tmp_path / "c.json"), op, variant, profile)
    assert e is not None and e.trials == 5 and abs(e.median_s - 1e-3) < 1e-12
    # the parameter named like a core field ("warps") is stored prefixed and read back by its name
    assert from_config(e.config, ["unroll", "warps", "name", "ratio", "flag"]) == \
        {"unroll": 2, "warps": 3, "name": "fast", "ratio": 0.5, "flag": True}
    assert store.describe_entry(e) == "C kernel saxpy 1024x1x1" and "warps=3" in store.config_text(e)
    # another compiler (runner environment) is another problem: a miss
    other = store.op_for("C", "saxpy", (1024, 1, 1), [], {"CC Version": "g++ 13"}, source="src",
                         tune_params={"unroll": [1, 2]})
    assert other.key != op.key and store.lookup(cache, other, variant, profile) is None


def test_corrupt_user_entries_are_rejected(tmp_path):
    _entry(tmp_path)
    raw = json.loads((tmp_path / "c.json").read_text())
    (key, entry), = raw["entries"].items()
    bad_cases = []
    for mutate in (lambda d: d["config"]["params"].__setitem__("unroll", [1, 2]),
                   lambda d: d.__setitem__("median_s", -1.0),
                   lambda d: d.__setitem__("median_s", float("nan")),
                   lambda d: d.__setitem__("op_key", ""),
                   lambda d: d["config"]["params"].__setitem__("bad name", 1)):
        d = json.loads(json.dumps(entry))
        mutate(d)
        bad_cases.append(cache_schema.entry_problem(key, d))
    assert all(bad_cases), bad_cases
    assert cache_schema.entry_problem(key.replace("user:c", "user:cuda"), entry) is not None  # key/field mismatch
    # a damaged file keeps its good entries and drops the bad one
    d = json.loads(json.dumps(entry))
    d["median_s"] = "fast"
    raw["entries"]["user:c:x:1|user.c.x|ffff|max_tflops"] = d
    parsed = cache_schema.parse(json.dumps(raw).encode())
    assert key in parsed.entries and len(parsed.bad) == 1
    assert PipelineConfig.from_dict(entry["config"]).get("unroll") == 2
