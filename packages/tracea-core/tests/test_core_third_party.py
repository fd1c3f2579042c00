"""A third-party backend written only from docs/plugin-guide.md, installed as a real distribution (its
entry-point metadata on sys.path, as pip would lay it out), is discovered, selected and produces correct
results — in a fresh process, as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "plugin-guide.md"


def _guide_files() -> dict[str, str]:
    """Code blocks of the guide that start with a ``# file: <path>`` line."""
    files = {}
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", GUIDE.read_text(), flags=re.S):
        first, _, body = block.partition("\n")
        m = re.match(r"# file: (\S+)", first)
        if m:
            files[m.group(1)] = body
    return files


def _install(site: Path) -> None:
    files = _guide_files()
    assert "tracea_example/plugin.py" in files and "pyproject.toml" in files
    pkg = site / "tracea_example"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(files["tracea_example/plugin.py"])
    # The metadata pip writes for the distribution, derived from the guide's pyproject.toml.
    toml = files["pyproject.toml"]
    name = re.search(r'^name = "(.+)"', toml, re.M).group(1)
    version = re.search(r'^version = "(.+)"', toml, re.M).group(1)
    ep = re.search(r"\[project.entry-points.tracea\]\n(\w+) = \"(.+)\"", toml)
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(f"[tracea]\n{ep.group(1)} = {ep.group(2)}\n")
    (dist / "RECORD").write_text("")


def test_third_party_plugin_from_docs_is_discovered_and_selected(tmp_path):
    _install(tmp_path)
    script = textwrap.dedent("""
        import json, numpy as np, tracea
        from tracea.reference import reference
        d = tracea.get_doctor()
        op = tracea.GemmOp(70, 50, 30, epilogue="bias+relu")
        decision = d.decide(op, "cpu")
        rng = np.random.default_rng()
        a = rng.standard_normal((70, 30), dtype=np.float32)
        b = rng.standard_normal((30, 50), dtype=np.float32)
        bias = rng.standard_normal(50, dtype=np.float32)
        out = tracea.ops.matmul(a, b, bias=bias, activation="relu")
        ref = reference(op, a=a, b=b, bias=bias)
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        print(json.dumps({"chosen": decision.variant.name,
                          "sources": d.pm.sources, "err": err,
                          "backends": [b.name for b in d.backends()]}))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p])
    env.pop("TRACEA_DISABLE_PLUGIN_AUTOLOAD", None)
    env["TRACEA_PLUGINS"] = ""
    env["TRACEA_BLOCK_PLUGINS"] = "cpu,cuda,opencl,torch"  # the example must win over the reference only
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["chosen"] == "example.gemm.blocked"
    assert result["sources"]["example"].startswith("entry point (tracea-example")
    assert "example" in result["backends"]
    assert result["err"] < 1e-5
