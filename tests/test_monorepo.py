"""Cross-package checks: every package of the monorepo has the layout, lockstep version and plugin
registration the project promises, and the installed plugins are what `tracea doctor` reports."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

import tracea

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def test_expected_packages_exist():
    assert [p.name for p in PACKAGES] == ["tracea-core", "tracea-cpu", "tracea-cuda", "tracea-opencl", "tracea-torch"]


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_package_layout_and_lockstep_version(pkg):
    meta = tomllib.loads((pkg / "pyproject.toml").read_text())
    assert meta["build-system"]["build-backend"] == "hatchling.build"
    assert meta["project"]["name"] == pkg.name
    module = pkg.name.replace("tracea-core", "tracea").replace("-", "_")
    version_file = pkg / "src" / module / "_version.py"
    assert re.search(r'__version__ = "(.+)"', version_file.read_text()).group(1) == tracea.__version__
    assert (pkg / "README.md").exists() and (pkg / "tests").is_dir()
    if pkg.name != "tracea-core":
        assert meta["project"]["entry-points"]["tracea"], "backends register through the tracea group"
        deps = meta["project"]["dependencies"]
        assert f"tracea-core=={tracea.__version__}" in deps


def test_installed_plugins_are_loaded_and_reported():
    doctor = tracea.get_doctor()
    installed = {ep.name for ep in metadata.entry_points(group="tracea")}
    loaded = {name for name, _ in doctor.pm.list_name_plugin()}
    env = {spec.rpartition("=")[0] or spec for spec in (__import__("os").environ.get("TRACEA_PLUGINS") or "").split(",")
           if spec}
    for name in installed | env:
        assert name in loaded or name in doctor.pm.load_errors, name
    reported = {b.name for b in doctor.backends()}
    assert {"reference", "host"} <= reported
    assert not doctor.version_mismatches()


def _source_files():
    for pkg in PACKAGES:
        yield from sorted((pkg / "src").rglob("*.py"))
    yield ROOT / "dev.py"
    yield ROOT / "conftest.py"


def test_every_environment_variable_read_is_documented_in_the_readme():
    """Each ``TRACEA_*`` name in the source (and the other variables the code reads) has a README row."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment variables"):]
    table = table[:table.index("\n## ", 3)]
    names = set()
    for path in _source_files():
        names |= set(re.findall(r"\b(TRACEA_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    names |= {"CC", "CXX", "XDG_CACHE_HOME"}
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, f"environment variables read but not in README's table: {missing}"


def test_every_warning_tracea_emits_is_a_tracea_warning():
    """``warnings.warn(..., Category)`` in the source names a subclass of ``tracea.errors.TraceaWarning``."""
    from tracea import errors

    bad = []
    for path in _source_files():
        text = path.read_text()
        for call in re.finditer(r"warnings\.warn\((.*?)(?:stacklevel=\d+)?\)\n", text, re.S):
            cats = re.findall(r",\s*([A-Z][A-Za-z]*Warning)\s*,", call.group(0) + ",")
            if not cats:
                bad.append(f"{path.name}: no category in {call.group(0)[:60]!r}")
                continue
            cls = getattr(errors, cats[-1], None)
            if not (isinstance(cls, type) and issubclass(cls, errors.TraceaWarning)):
                bad.append(f"{path.name}: {cats[-1]}")
    assert not bad, bad


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_package_is_complete_for_an_index(pkg):
    """What PyPI shows and a type checker needs: license file, py.typed, classifiers, project URLs,
    and a README whose links work outside the repository."""
    meta = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    module = pkg.name.replace("tracea-core", "tracea").replace("-", "_")
    assert (pkg / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and meta["license"] == "Apache-2.0"
    assert (pkg / "src" / module / "py.typed").exists()
    assert "Typing :: Typed" in meta["classifiers"] and len(meta["classifiers"]) >= 8
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(meta["urls"])
    links = re.findall(r"\]\(([^)]+)\)", (pkg / "README.md").read_text())
    relative = [link for link in links if not link.startswith(("https://", "http://", "#"))]
    assert not relative, f"{pkg.name}/README.md links that break on PyPI: {relative}"
