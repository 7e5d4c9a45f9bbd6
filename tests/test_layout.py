"""The tree's promises: the public import paths, one atomic writer, no import circle in studies/."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [  # (module, attribute) users may have imported
    ("attngeom", "measure"), ("attngeom", "view"),
    ("attngeom.store", "open"), ("attngeom.store", "open_store"), ("attngeom.store", "write"),
    ("attngeom.store", "read_manifest"), ("attngeom.store", "StoreError"),
    ("attngeom.store.options", "ExtractConfig"), ("attngeom.store.options", "FaithConfig"),
    ("attngeom.store.options", "AnalysisOptions"),
    ("attngeom.extract.run", "extract"), ("attngeom.extract.faithfulness", "faithfulness"),
    ("attngeom.analysis", "sinks"), ("attngeom.analysis", "convexity"),
    ("attngeom.analysis", "anti_alignment"), ("attngeom.analysis", "decomposition"),
    ("attngeom.analysis", "run_all"), ("attngeom.reports", "build_report"),
]


@pytest.mark.parametrize("module, name", PUBLIC)
def test_public_import_paths(module, name):
    assert callable(getattr(importlib.import_module(module), name))


def test_the_xarray_engine_is_registered():
    import xarray as xr

    assert "attngeom" in xr.backends.list_engines()


def _package_files():
    for part in ("extract", "store", "analysis", "reports", "attngeom"):
        yield from (ROOT / part).rglob("*.py")


def test_files_are_renamed_into_place_only_by_the_atomic_writer():
    """Every file goes through store/io/atomic.py; the one other rename is a model cache
    folder (a directory, replaced whole)."""
    found = {p.relative_to(ROOT).as_posix() for p in _package_files()
             if re.search(r"\bos\.(replace|rename)\(", p.read_text())}
    assert found == {"store/io/atomic.py", "extract/loading/models.py"}


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(re.findall(r'"(attngeom[\w.]*)"', (ROOT / "pyproject.toml").read_text()))
    for part in ("extract", "store", "analysis", "reports"):
        for init in (ROOT / part).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            assert ".".join(("attngeom",) + rel) in listed, init


def _local_imports(path: Path, names: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & names


def test_studies_have_no_import_circle():
    files = {p.stem: p for p in (ROOT / "studies").glob("*.py")}
    graph = {name: _local_imports(p, set(files)) for name, p in files.items()}
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for dep in graph[name]:
            visit(dep)
        path.pop()
        done.add(name)

    for name in graph:
        visit(name)
    assert not [n for n in files if re.search(r"\d$", n)], "studies files named by a number"
