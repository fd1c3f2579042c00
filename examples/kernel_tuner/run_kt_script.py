#!/usr/bin/env python
"""Run one of *Kernel Tuner's own* example scripts through Tracea, changing only its import.

    python examples/kernel_tuner/run_kt_script.py /path/to/kernel_tuner/examples/cuda/matmul.py
    python examples/kernel_tuner/run_kt_script.py SCRIPT --kt-python /venv-with-kernel_tuner/bin/python --json out.json

The script is read from Kernel Tuner's repository (nothing of it is copied into Tracea), its import lines
are rewritten - ``import kernel_tuner`` becomes ``import tracea as kernel_tuner`` and ``from kernel_tuner
import X`` becomes ``from tracea import X`` - and every other line is left as it is; the diff is printed.
Then it runs as ``__main__`` in its own directory (so it finds its ``.cu`` files). A script that imports
other parts of Kernel Tuner (``kernel_tuner.file_utils`` ...) is refused: that would not be an import-only
change.

Every ``tune_kernel`` call the script makes is recorded, and afterwards checked: the configs Tracea
evaluated must be exactly the script's parameter space (the product of ``tune_params`` minus its
``restrictions`` and, for CUDA, blocks over 1024 threads) whenever Tracea measured the whole space (it
does for spaces up to its sampling budget); otherwise every evaluated config must lie in that space.
With ``--kt-python`` the space is also built by Kernel Tuner's own ``Searchspace`` in that Python and
compared. Whether the script passed an ``answer`` (so every config was verified) is reported.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IMPORT_RULES = [
    (re.compile(r"^(\s*)import kernel_tuner\s*$"), r"\1import tracea as kernel_tuner"),
    (re.compile(r"^(\s*)from kernel_tuner import (.+)$"), r"\1from tracea import \2"),
]
OTHER_KT = re.compile(r"^\s*(from kernel_tuner\.|import kernel_tuner\.)")


def rewrite(text: str) -> tuple[str, list[str]]:
    """The script with its Kernel Tuner imports pointed at Tracea, and the unified diff (only import lines)."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        if OTHER_KT.match(body):
            raise SystemExit(f"refused: {body.strip()!r} imports a part of Kernel Tuner other than tune_kernel/run_kernel")
        for pat, rep in IMPORT_RULES:
            if pat.match(body):
                body = pat.sub(rep, body)
                break
        out.append(body + ("\n" if line.endswith("\n") else ""))
    new = "".join(out)
    diff = list(difflib.unified_diff(text.splitlines(), new.splitlines(), "kernel_tuner", "tracea", lineterm="", n=0))
    changed = [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    if not changed:
        raise SystemExit("refused: the script does not import kernel_tuner")
    assert all("kernel_tuner" in d or "tracea" in d for d in changed), changed
    return new, diff


def expected_space(tune_params: dict, restrictions: Any, lang: str) -> set[tuple]:
    """The valid configs, computed independently of Tracea: the product of the lists minus the restrictions."""
    names = list(tune_params)
    rs = [] if restrictions is None else ([restrictions] if callable(restrictions) or isinstance(restrictions, str)
                                          else list(restrictions))
    out = set()
    for combo in itertools.product(*tune_params.values()):
        p = dict(zip(names, combo))
        ok = all((r(p) if callable(r) else eval(r, {}, dict(p))) for r in rs)  # noqa: S307 - the script's own text
        if ok and lang.upper() != "C":
            threads = p.get("block_size_x", 256) * p.get("block_size_y", 1) * p.get("block_size_z", 1)
            ok = threads <= 1024
        if ok:
            out.add(combo)
    return out


KT_SPACE = r"""
import json, sys
from kernel_tuner.searchspace import Searchspace
d = json.load(sys.stdin)
s = Searchspace(d["tune_params"], d["restrictions"], d["max_threads"])
print(json.dumps([list(c) for c in s.list]))
"""


def kt_space(kt_python: str, tune_params: dict, restrictions: Any, lang: str) -> set[tuple] | None:
    if restrictions is not None and not all(isinstance(r, str) for r in restrictions):
        return None
    payload = json.dumps({"tune_params": tune_params, "restrictions": restrictions,
                          "max_threads": 1024 if lang.upper() != "C" else 1 << 30})
    out = subprocess.run([kt_python, "-c", KT_SPACE], input=payload, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return {tuple(c) for c in json.loads(out.stdout)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="a Kernel Tuner example script (from Kernel Tuner's repository)")
    p.add_argument("--kt-python", default=None, help="a Python with kernel_tuner: compare with its Searchspace")
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--atol", type=float, default=None,
                   help="NOT verbatim: pass this atol to every tune_kernel call that checks an answer (reported)")
    args = p.parse_args()

    import tracea

    script = Path(args.script).resolve()
    new, diff = rewrite(script.read_text())
    print("\n".join(diff))
    calls: list[dict[str, Any]] = []
    injected: list[str] = []  # kernels whose call got --atol (only calls that check an answer)
    real = tracea.tune_kernel

    def recording_tune_kernel(kernel_name, kernel_source, problem_size, arguments, tune_params, *a, **kw):
        t0 = time.perf_counter()
        if args.atol is not None and (kw.get("answer") is not None or kw.get("verify") is not None):
            kw["atol"] = args.atol
            injected.append(kernel_name)
        results, env = real(kernel_name, kernel_source, problem_size, arguments, tune_params, *a, **kw)
        calls.append({"kernel_name": kernel_name, "tune_params": {k: list(v) for k, v in tune_params.items()},
                      "restrictions": kw.get("restrictions"), "lang": env.get("lang", kw.get("lang") or ""),
                      "answer": kw.get("answer") is not None or kw.get("verify") is not None,
                      "results": results, "env": env, "seconds": time.perf_counter() - t0})
        return results, env

    tracea.tune_kernel = recording_tune_kernel
    patched = script.with_name(f".tracea_{script.name}")
    patched.write_text(new)
    cwd = os.getcwd()
    os.chdir(script.parent)
    sys.path.insert(0, str(script.parent))
    error = None
    try:
        runpy.run_path(str(patched), run_name="__main__")
    except Exception as exc:  # noqa: BLE001 - reported: the script raised (as it would under Kernel Tuner)
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
        print(f"the script raised {error}")
    finally:
        os.chdir(cwd)
        patched.unlink()
        tracea.tune_kernel = real
    summary = []
    ok_all = bool(calls) and error is None
    for c in calls:
        names = list(c["tune_params"])
        space = expected_space(c["tune_params"], c["restrictions"], c["lang"])
        seen = [tuple(r[n] for n in names) for r in c["results"]]
        ran = [r for r in c["results"] if isinstance(r.get("time"), float)]
        whole = len(space) <= c["env"].get("evaluations", len(seen)) or c["env"].get("strategy") == "brute_force"
        same = set(seen) == space if whole else set(seen) <= space
        kt = kt_space(args.kt_python, c["tune_params"], c["restrictions"], c["lang"]) if args.kt_python else None
        row = {"kernel": c["kernel_name"], "lang": c["lang"], "space": len(space), "evaluated": len(seen),
               "ran": len(ran), "whole_space": whole, "space_matches": same,
               "kt_searchspace_matches": None if kt is None else kt == space,
               "verified_against_answer": c["answer"], "device": c["env"].get("device_name"),
               "best": {k: v for k, v in c["env"].get("best_config", {}).items() if k in names or k == "time"},
               "seconds": round(c["seconds"], 1)}
        ok_all &= same and kt in (None, space) and len(ran) > 0
        summary.append(row)
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"script": str(script), "diff": diff, "calls": summary, "error": error,
                                               "atol_injected": {"atol": args.atol, "into": injected} if injected else None},
                                              indent=1))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
