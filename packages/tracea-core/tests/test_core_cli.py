"""The tracea CLI: doctor report (text and JSON), op explanations, errors, version."""

from __future__ import annotations

import json
import subprocess
import sys

from tracea.cli.main import main
from tracea.cli.opspec import parse_op
from tracea.doctor.cpu_probe import probe_cpu

import pytest
from tracea.errors import InvalidArgumentError


def test_doctor_text_lists_isa_backends_variants(capsys):
    assert main(["doctor", "--op", "gemm:m=33,n=17,k=9,epilogue=bias+gelu"]) == 0
    text = capsys.readouterr().out
    for flag in probe_cpu().simd:
        assert flag in text
    assert "reference" in text and "reference.gemm" in text
    assert "Decision: gemm 33x17x9" in text and "chosen:" in text


def test_doctor_json_is_complete(capsys):
    assert main(["doctor", "--json", "--op", "conv2d:n=1,c=3,h=8,w=8,k=4,r=3,padding=1,groups=1",
                 "--op", "gemm m=4 n=4 k=4 dtype=int8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"][0]["device"] == "cpu:0"
    assert {"reference", "host"} <= {b["name"] for b in report["backends"]}
    ok, bad = report["decisions"]
    assert ok["ok"] and ok["chosen"]["variant"]
    assert not bad["ok"] and any("int8" in " ".join(r["reasons"]) for r in bad["rejected"])


def test_bad_op_spec_exits_2(capsys):
    assert main(["doctor", "--op", "gemm:m=0,n=1,k=1"]) == 2
    assert "argument 'm'" in capsys.readouterr().err
    assert main(["doctor", "--op", "matmul:m=1"]) == 2


def test_opspec_parsing():
    op = parse_op("conv2d:n=2,c=8,h=9,w=9,k=4,r=3,stride=2x1,padding=1,layout=nhwc,epilogue=bias+silu")
    assert op.stride == (2, 1) and op.s == 3 and op.layout.value == "nhwc" and op.epilogue.key == "bias+silu"
    assert parse_op("attention batch=1 heads=2 seq_q=8 head_dim=16 causal=true").seq_kv == 8
    with pytest.raises(InvalidArgumentError, match="field of gemm"):
        parse_op("gemm:m=1,n=1,k=1,tile=3")


def test_version_entry_point():
    proc = subprocess.run([sys.executable, "-m", "tracea", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "tracea 0.1.0"
