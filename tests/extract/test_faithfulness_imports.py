"""The modules of extract/ import each other without a circle, counting the imports made inside
functions (a function-level import that dodges a circle is still a circle): read from the
source with ``ast``, each module an edge to every sibling it imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "extract"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(name: str, path: Path, node: ast.AST, modules: dict) -> set[str]:
    """The modules of ``modules`` an import statement in module ``name`` loads."""
    if isinstance(node, ast.Import):
        names = [a.name.removeprefix("attngeom.") for a in node.names]
        return {n for n in names if n in modules}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        here = package[:len(package) - node.level + 1]
        base = ".".join(here + ([node.module] if node.module else []))
    else:
        base = (node.module or "").removeprefix("attngeom.")
    found = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
    return found | ({base} if base in modules and len(found) < len(node.names) else set())


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _targets(name, path, node, modules) - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, path, found = {}, [], []

    def visit(u: str) -> None:
        state[u] = "open"
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == "open":
                found.append(path[path.index(v):] + [v])
            elif v not in state:
                visit(v)
        path.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_the_graph_is_read_from_the_source():
    graph = _graph()
    assert "extract.faithfulness.kernels" in graph["extract.faithfulness.layer_scores"]
    assert "extract.faithfulness.base" in graph["extract.faithfulness.zeroing"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_of_extract_imports_itself_through_others():
    assert _circles(_graph()) == []


def test_the_faithfulness_dispatchers_sit_above_the_kernels():
    """The kernels' modules import neither the table of kernels nor its dispatchers."""
    graph = _graph()
    above = {"extract.faithfulness.kernels", "extract.faithfulness.layer_scores"}
    for name in ("exact_scores", "removal_scores", "field_scores", "random_scores", "zeroing",
                 "base"):
        assert not graph[f"extract.faithfulness.{name}"] & above, name
