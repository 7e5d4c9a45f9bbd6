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


# earlier paths of what moved to attngeom.common: each is the same module object
MOVED = [("attngeom.store.format.metrics", "attngeom.common.metrics"),
         ("attngeom.store.format.vocab", "attngeom.common.vocab"),
         ("attngeom.store.errors", "attngeom.common.errors"),
         ("attngeom.store.options.stages", "attngeom.common.options.stages"),
         ("attngeom.store.options.spec", "attngeom.common.options.spec"),
         ("attngeom.store.options.ranges", "attngeom.common.options.ranges")]


@pytest.mark.parametrize("old, new", MOVED)
def test_moved_modules_keep_their_old_import_paths(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_plugin_authors_imports_still_work():
    from attngeom.common import metrics
    from attngeom.store.format.metrics import Metric, register
    from attngeom.store.options import AnalysisOptions, ExtractConfig, FaithConfig

    from attngeom.common.options import stages

    assert Metric is metrics.Metric and register is metrics.register
    assert (AnalysisOptions, ExtractConfig, FaithConfig) == (
        stages.AnalysisOptions, stages.ExtractConfig, stages.FaithConfig)


# which part may import which (attngeom.<part>): the declared arrows, and nothing into common
MAY_IMPORT = {"common": set(), "store": {"common"}, "analysis": {"common", "store"},
              "reports": {"common", "store", "analysis"},
              "extract": {"common", "store"}}
FOLDERS = {"common": ROOT / "attngeom" / "common", "store": ROOT / "store",
           "analysis": ROOT / "analysis", "reports": ROOT / "reports",
           "extract": ROOT / "extract"}


def _attngeom_parts(path: Path) -> set[str]:
    """The attngeom parts a module imports (absolute imports, at any depth of the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        found |= {n.split(".")[1] for n in names if n.startswith("attngeom.")}
    return found


@pytest.mark.parametrize("part", MAY_IMPORT)
def test_imports_follow_the_arrows(part):
    bad = {p.relative_to(ROOT).as_posix(): sorted(_attngeom_parts(p) - MAY_IMPORT[part]
                                                  - {part})
           for p in FOLDERS[part].rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


# inside store/ (CONTRIBUTING.md): format <- io <- dataset, ops
STORE_MAY_IMPORT = {"format": set(), "io": {"format"}, "dataset": {"format", "io"},
                    "ops": {"format", "io"}}


def _store_rooms(path: Path, room: str) -> set[str]:
    """The store/ rooms a module of store/<room>/ imports (absolute or relative, any depth)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names
                      if a.name.startswith("attngeom.store.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.startswith("attngeom.store."):
                found.add(module.split(".")[2])
            elif node.level == 1:
                found.add(room)
            elif node.level == 2:
                found |= {module.split(".")[0]} if module else {a.name for a in node.names}
    return found


@pytest.mark.parametrize("room", STORE_MAY_IMPORT)
def test_imports_flow_one_way_inside_the_store(room):
    """Issue 41: format/ imports no other room of store/, io/ only format/."""
    bad = {p.relative_to(ROOT).as_posix(): sorted(_store_rooms(p, room) - STORE_MAY_IMPORT[room]
                                                  - {room})
           for p in (ROOT / "store" / room).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_registry_and_the_options_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import attngeom.common.metrics, attngeom.common.options, "
            "attngeom.store, attngeom.analysis; print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.strip() == "False", run.stderr


def test_the_xarray_engine_is_registered():
    import xarray as xr

    assert "attngeom" in xr.backends.list_engines()


def _package_files():
    for part in ("extract", "store", "analysis", "reports", "attngeom"):
        yield from (ROOT / part).rglob("*.py")


def test_files_are_renamed_into_place_only_by_the_atomic_writer():
    """Every file goes through attngeom/common/atomic.py; the one other rename is a model cache
    folder (a directory, replaced whole)."""
    found = {p.relative_to(ROOT).as_posix() for p in _package_files()
             if re.search(r"\bos\.(replace|rename)\(", p.read_text())}
    assert found == {"attngeom/common/atomic.py", "extract/loading/models.py"}


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
