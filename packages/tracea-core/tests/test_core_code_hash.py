"""A variant's default source hash: its package's Python sources, so tuned entries follow code changes."""

from __future__ import annotations

import importlib
import sys

import pytest

from tracea.doctor.code_hash import module_source_hash


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "hashpkg_example"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "kernels.py").write_text("SOURCE = 'v1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("hashpkg_example.sub.kernels")
    module_source_hash.cache_clear()
    yield root
    for name in [m for m in sys.modules if m.startswith("hashpkg_example")]:
        del sys.modules[name]
    module_source_hash.cache_clear()


def test_the_hash_covers_every_file_of_the_top_package(package):
    first = module_source_hash("hashpkg_example.sub.kernels")
    assert len(first) == 16 and first == module_source_hash("hashpkg_example")  # the top package's files
    module_source_hash.cache_clear()
    (package / "sub" / "kernels.py").write_text("SOURCE = 'v2'\n")
    edited = module_source_hash("hashpkg_example.sub.kernels")
    module_source_hash.cache_clear()
    (package / "sub" / "new.py").write_text("")
    added = module_source_hash("hashpkg_example.sub.kernels")
    assert len({first, edited, added}) == 3


def test_nothing_to_read_gives_an_empty_hash(monkeypatch):
    assert module_source_hash("no_such_module_anywhere.x") == ""
    mod = type(sys)("frozen_like_module")  # no __file__, no __path__
    monkeypatch.setitem(sys.modules, "frozen_like_module", mod)
    assert module_source_hash("frozen_like_module") == ""
