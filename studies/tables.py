"""Number formatting and metric labels shared by the studies' table builders
(studies/summarize.py, studies/summarize_faithfulness.py).
"""

from __future__ import annotations

import math

from attngeom.common import metrics as M

SHORT = {name: M.label(name, "abbrev") for name in M.names()}   # raw, vw, vwn, contrib, ...


def f(x, d: int = 2) -> str:
    """Short number: fixed with d decimals, scientific when tiny."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "n/a"
    if x != 0 and abs(x) < 10 ** -d:
        return f"{x:.1e}"
    return f"{x:.{d}f}"


def markdown(rows, models: list[str]) -> str:
    """A claims table: one row per (name, cell(model)), one column per model."""
    lines = ["| claim | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(m) for m in models) + " |" for name, cell in rows]
    return "\n".join(lines)
