"""The how-to pages' code that the site build does not execute stays true.

docs/howto/metric-plugin.md shows a plugin's two kernels and the register call that names them:
the kernels are tests/user_metric.py's (the same code, docstrings aside), which
tests/extract/test_metric_registry.py runs through `attngeom faithfulness`, and the register
call, run with the page's kernels as the module it names, registers a metric whose kernels
attngeom finds.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import user_metric
from attngeom.common import metrics as M

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "docs" / "howto" / "metric-plugin.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PLUGIN.read_text(encoding="utf-8"), re.S)


def _functions(source: str) -> dict[str, str]:
    """Each top-level function's code without its docstring, as an AST dump."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            found[node.name] = ast.dump(ast.Module(body=body, type_ignores=[]))
    return found


def test_the_plugin_kernels_are_the_tested_ones():
    kernels, _ = _blocks()
    page = _functions(kernels)
    tested = _functions(Path(user_metric.__file__).read_text(encoding="utf-8"))
    assert set(page) == {"fast_value_norm", "exact_value_norm"}
    assert all(page[name] == tested[name] for name in page)


def test_the_plugin_registers_and_its_kernels_are_found(monkeypatch):
    from attngeom.extract.faithfulness import kernels as K

    kernels, call = _blocks()
    module = types.ModuleType("mypkg.scores")
    exec(compile(kernels, "mypkg/scores.py", "exec"), module.__dict__)
    package = types.ModuleType("mypkg")
    package.scores = module
    monkeypatch.setitem(sys.modules, "mypkg", package)
    monkeypatch.setitem(sys.modules, "mypkg.scores", module)
    try:
        exec(compile(call, str(PLUGIN), "exec"), {})
        assert "value_norm" in M.names()
        assert K.kernels("value_norm").fast is module.fast_value_norm
        assert K.kernels("value_norm").exact is module.exact_value_norm
    finally:
        if "value_norm" in M.names():
            M.unregister("value_norm")
