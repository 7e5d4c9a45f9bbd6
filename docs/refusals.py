"""Every refusal attngeom can raise, read from the code: ``python docs/refusals.py > docs/refusals.md``.

A refusal is a ``raise`` of :class:`attngeom.common.errors.Refusal` or of a class derived from it
(``StoreError``, ``StoreWriteError``, ``Unsupported``, ...) anywhere in the package's folders.
Each message is shown with ``{...}`` where the code fills in a value; the table is grouped by
file, in source order. tests/test_errors.py checks that docs/refusals.md is current.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("attngeom", "extract", "store", "analysis", "reports")
BASE = "Refusal"


def _classes(trees: dict[Path, ast.Module]) -> set[str]:
    """Names of Refusal and of every class derived from it (transitively)."""
    found = {BASE}
    while True:
        more = {node.name for tree in trees.values() for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef) and node.name not in found
                and any(isinstance(b, ast.Name) and b.id in found for b in node.bases)}
        if not more:
            return found
        found |= more


def _text(node: ast.AST) -> str:
    """A message expression as text, ``{...}`` for what the code fills in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{...}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return f"{_text(node.body)} / {_text(node.orelse)}"
    return "{...}"


def refusals() -> list[tuple[str, int, str, str]]:
    """(file, line, class, message) of every refusal raised in the package."""
    files = sorted(p for part in PARTS for p in (ROOT / part).rglob("*.py"))
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in files}
    names = _classes(trees)
    out = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in names and node.exc.args:
                message = " ".join(_text(node.exc.args[0]).split())
                out.append((path.relative_to(ROOT).as_posix(), node.lineno, name, message))
    return sorted(out)


def markdown() -> str:
    rows = refusals()
    lines = ["# Refusals", "",
             "Every error attngeom raises on purpose: one line naming the problem and the fix, "
             "exit status 2 on the command line (any other error is a bug, reported as an "
             "internal error with exit status 70). Generated from the code by "
             "`python docs/refusals.py`; `{...}` is a value the code fills in.", ""]
    current = None
    for file, _, cls, message in rows:
        if file != current:
            lines += ["", f"## `{file}`", "", "| class | message |", "|---|---|"]
            current = file
        cell = message.replace("|", r"\|")
        lines.append(f"| {cls} | {cell} |")
    lines += ["", f"{len(rows)} refusals in {len({r[0] for r in rows})} files.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
