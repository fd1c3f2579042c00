"""Library manners: no process-wide logging or warning-filter change on import or tuning, one warning
base class, clean CLI errors and help texts without reST markup."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest

from tracea.cli.main import build_parser, main
from tracea.cli.rst import plain
from tracea.errors import SamplerFallbackWarning, TraceaWarning


def test_import_and_tuning_leave_optuna_logging_and_warning_filters_alone():
    code = """
import importlib.util, logging, warnings, optuna
if importlib.util.find_spec("torch"):
    import torch  # torch installs its own filters when imported (a plugin may import it): not ours
optuna.logging.set_verbosity(optuna.logging.INFO)
before_filters = list(warnings.filters)
import tracea
from tracea import GemmOp
from tracea.tuning.autotuner import AutoTuner
from tracea.tuning.cache import TuningCache
import tempfile, os
AutoTuner(trials=12, progress=False, sampler="tpe", seed=0,
          cache=TuningCache(os.path.join(tempfile.mkdtemp(), "c.json"))).tune(GemmOp(40, 72, 56), "cpu")
print(optuna.logging.get_verbosity() == optuna.logging.INFO, warnings.filters == before_filters)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["True", "True"], out.stdout


def test_quiet_optuna_restores_the_callers_state():
    optuna = pytest.importorskip("optuna")
    from tracea.tuning.search import quiet_optuna

    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    filters = list(warnings.filters)
    try:
        with quiet_optuna():
            assert optuna.logging.get_verbosity() == optuna.logging.ERROR
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
        assert warnings.filters == filters
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_missing_scipy_warns_once_and_uses_tpe(monkeypatch):
    from tracea.tuning import search

    monkeypatch.setattr(search, "gp_available", lambda: False)
    monkeypatch.setattr(search, "_warned_no_gp", False)
    with pytest.warns(SamplerFallbackWarning, match=r"needs SciPy.*tracea-core\[gp\]"):
        assert search.resolve_sampler("auto") == "tpe"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert search.resolve_sampler("auto") == "tpe"  # once per process
    assert issubclass(SamplerFallbackWarning, TraceaWarning)


def test_tune_graph_with_a_missing_or_invalid_file_is_a_clean_error(tmp_path, capsys):
    assert main(["tune", "--graph", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "missing.json" in err and "No such file" in err and "Traceback" not in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["tune", "--graph", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    out = subprocess.run([sys.executable, "-m", "tracea", "tune", "--graph", str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "nope.json" in out.stderr


@pytest.mark.parametrize("command", ["tune", "cache", "doctor"])
def test_help_has_no_rest_markup(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if getattr(a, "choices", None) and command in a.choices)
    text = sub.choices[command].format_help()
    assert "``" not in text and ":func:" not in text and ":class:" not in text


def test_plain_strips_roles_and_literals():
    assert plain("``tracea tune``: see :func:`tracea.tuning.graph.optimize_graph`") == \
        "tracea tune: see optimize_graph"
    assert plain(None) == ""


def test_no_root_logger_configuration_on_import():
    root = logging.getLogger()
    handlers = list(root.handlers)
    import tracea  # noqa: F401

    assert root.handlers == handlers
