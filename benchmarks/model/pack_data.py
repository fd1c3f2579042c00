"""Turn a raw measurement file of ``collect_cuda.py`` / ``collect_cpu.py`` into the data file a backend
ships (see :mod:`tracea.perfmodel.data` for the format).

    python benchmarks/model/pack_data.py RAW.json packages/tracea-cuda/src/tracea_cuda/perf_data/sm_90.json
        [--merge SHIPPED.json]

``--merge`` keeps the rows (and anchor rows) of an already packed file whose (variant, op) the raw file did
not measure, so a refresh of some shapes (``collect_cuda.py --ms``) adds to the shipped data; the header
(device, date) is the new run's, and the merged file says so in ``method``.
"""

from __future__ import annotations

import json
import re
import sys

from tracea.perfmodel.data import pack


def tile_of(config_key: str) -> list[int]:
    m = re.search(r"(?:^|\.)tm(\d+)\.tn(\d+)", config_key or "")
    return [int(m.group(1)), int(m.group(2))] if m else [0, 0]


def merged(data: dict, old: dict) -> dict:
    """``data`` plus the rows and anchor rows of ``old`` (a packed file) for ops ``data`` does not hold."""
    key = lambda op: json.dumps(op, sort_keys=True)  # noqa: E731
    new_rows = {(r[0], key(r[1])) for r in data["rows"]}
    new_anchor = {key(a[0]) for a in data.get("anchor", [])}
    rows = data["rows"] + [r for r in old.get("rows", []) if (r[0], key(r[1])) not in new_rows]
    anchor = data.get("anchor", []) + [a for a in old.get("anchor", []) if key(a[0]) not in new_anchor]
    method = data.get("method", "") + f"; merged with rows measured {old.get('measured_at', '?')}"
    return {**data, "method": method, "rows": rows, "anchor": anchor}


def main(raw_path: str, out_path: str, *rest: str) -> int:
    raw = json.load(open(raw_path))
    rows = [dict(r, tile=tile_of(r.get("config", "")) if raw.get("backend") == "cuda" else [0, 0])
            for r in raw["records"] if "seconds" in r and "error" not in r]
    prof = raw.get("profile") or {}
    header = {"backend": raw["backend"], "arch_key": raw["arch_key"], "device_name": prof.get("name", ""),
              "measured_at": raw.get("measured_at", ""), "method": raw.get("method", ""),
              "anchor_name": raw.get("anchor_name", "torch " + str(raw.get("torch", ""))), "profile": prof}
    data = pack(rows, header, raw.get("torch_s"))
    if rest[:1] == ("--merge",) and len(rest) == 2:
        data = merged(data, json.load(open(rest[1])))
    with open(out_path, "w") as f:  # one row per line: readable diffs
        f.write("{\n")
        items = list(data.items())
        for i, (key, value) in enumerate(items):
            end = ",\n" if i < len(items) - 1 else "\n"
            if key in ("rows", "anchor"):
                f.write(f"{json.dumps(key)}: [\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in value)
                        + "\n]" + end)
            else:
                f.write(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}{end}")
        f.write("}\n")
    print(f"{out_path}: {len(data['rows'])} rows, {len(data.get('anchor', []))} anchor rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
