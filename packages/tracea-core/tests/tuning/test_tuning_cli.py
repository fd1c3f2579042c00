import json

import pytest

from tracea.cli import tune_cmd
from tracea.errors import InvalidArgumentError
from tracea.ir import Conv2dOp, GemmOp


@pytest.fixture
def cli(doctor, cache, monkeypatch):
    """The real ``tracea`` parser; the process Doctor is the test Doctor (see the doctor fixture)."""
    from tracea.cli.main import build_parser

    monkeypatch.setenv("TRACEA_CACHE_PATH", cache.path)
    from tracea.tuning.cache import set_cache

    set_cache(None)
    parser = build_parser()

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.func(args)

    yield run
    set_cache(None)


def test_parse_op_spec():
    assert tune_cmd.parse_op_spec("gemm:64x32x16") == GemmOp(64, 32, 16)
    assert tune_cmd.parse_op_spec("gemm:2x64x32x16") == GemmOp(64, 32, 16, batch=2)
    assert tune_cmd.parse_op_spec("gemm:m=8,n=4,k=2,trans_a=true") == GemmOp(8, 4, 2, trans_a=True)
    conv = tune_cmd.parse_op_spec("conv2d:n=1,c=4,h=8,w=8,k=4,r=3,s=3,padding=1,stride=2x2")
    assert conv == Conv2dOp(1, 4, 8, 8, 4, 3, 3, padding=(1, 1), stride=(2, 2))
    with pytest.raises(InvalidArgumentError):
        tune_cmd.parse_op_spec("gemm:64x32")
    with pytest.raises(InvalidArgumentError):
        tune_cmd.parse_op_spec("matmul:m=1")


def test_tune_then_cache_commands(cli, cache, capsys, tmp_path):
    assert cli("tune", "gemm:32x24x16", "--trials", "4", "--sampler", "random", "--seed", "1",
               "--no-progress") == 0
    out = capsys.readouterr().out
    assert "testnp.gemm.blocked" in out and "best:" in out and cache.path in out
    assert cli("tune", "gemm:32x24x16", "--json", "--no-progress") == 0
    assert json.loads(capsys.readouterr().out)["from_cache"] is True

    assert cli("cache", "ls") == 0
    out = capsys.readouterr().out
    assert "gemm 32x24x16" in out and "current" in out and "1 entry" in out
    assert cli("cache", "ls", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["variant"] == "testnp.gemm.blocked" and listed[0]["status"] == "current"
    assert cli("cache", "show", "0") == 0
    assert "median/p90" in capsys.readouterr().out
    export = tmp_path / "exp.json"
    assert cli("cache", "export", str(export)) == 0
    assert cli("cache", "clear", "--yes") == 0
    assert "deleted 1 entry" in capsys.readouterr().out
    assert cli("cache", "import", str(export)) == 0
    assert cli("cache", "ls", "--json") == 0
    assert len(json.loads(capsys.readouterr().out.split("\n", 1)[1])) == 1


def test_tune_graph_file_and_plot(cli, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps({"iterations": 5, "goal": "balanced", "nodes": [
        {"kind": "gemm", "m": 24, "n": 24, "k": 24}, {"kind": "gemm", "m": 24, "n": 24, "k": 24},
        {"kind": "conv2d", "n": 1, "c": 4, "h": 6, "w": 6, "k": 4, "r": 3, "s": 3, "padding": [1, 1]}]}))
    assert cli("tune", "--graph", str(graph), "--no-progress", "--seed", "0") == 0
    out = capsys.readouterr().out
    assert "0,1" in out and "conv2d" in out
    png = tmp_path / "p.png"
    assert cli("tune", "gemm:16x16x16", "--trials", "3", "--no-progress", "--plot", str(png)) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_tune_reports_bad_spec(cli, capsys):
    assert cli("tune", "gemm:0x1x1", "--no-progress") == 2
    assert "tracea tune:" in capsys.readouterr().err
