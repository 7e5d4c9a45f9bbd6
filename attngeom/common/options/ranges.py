"""The one syntax for selecting layers, heads and sequences on every command line.

Comma-separated items, Python-style half-open ranges: ``0:4`` is 0, 1, 2, 3; ``7`` is one
value; ``5:`` runs to the last available value, ``:3`` starts at 0. ``5-7`` (inclusive: 5, 6,
7) is also accepted, as ``analyze --layers`` and ``faithfulness --layers`` always took it.
The result is sorted and without repeats.
"""

from __future__ import annotations

import re
from typing import Sequence
from ..errors import Refusal

_ITEM = re.compile(r"\s*(\d*)\s*(:|-)?\s*(\d*)\s*")
SYNTAX = "numbers and half-open ranges, e.g. 0:4,7 (5-7 inclusive also works)"


def parse_ranges(spec: str | Sequence[int] | None, available: Sequence[int] | None = None,
                 what: str = "--layers", where: str = "the store") -> list[int] | None:
    """Selected values of ``spec``, sorted; None when ``spec`` is None or ``"all"``.

    Parameters
    ----------
    spec : a range string (see module doc) or a sequence of ints.
    available : the values that exist (labels of the store, 0..n-1 of the model); needed for an
        open end ``5:``. Values outside it raise ValueError naming the first one.
    what, where : the option's name and what ``available`` belongs to, for messages.
    """
    if spec is None or (isinstance(spec, str) and spec.strip() == "all"):
        return None
    values = [int(v) for v in spec] if not isinstance(spec, str) else _parse(spec, available, what)
    if available is not None:
        have = set(int(v) for v in available)
        bad = [v for v in values if v not in have]
        if bad:
            raise Refusal(f"{what} {bad[0]} is not in {where} (it has {runs_text(sorted(have))})")
    if not values:
        raise Refusal(f"{what} '{spec}' selects nothing; give {SYNTAX}")
    return sorted(set(values))


def check_syntax(spec: str, what: str = "--layers") -> str:
    """``spec`` itself when it is ``all`` or in the range syntax (open ends allowed: they are
    resolved when the available values are known), else ValueError with the syntax."""
    if spec.strip() != "all" and not _parse(spec, None, what, open_ends=True):
        raise Refusal(f"{what} '{spec}' selects nothing; give {SYNTAX}")
    return spec


def _parse(spec: str, available: Sequence[int] | None, what: str,
           open_ends: bool = False) -> list[int]:
    """The values ``spec`` names; with ``open_ends`` (and no ``available``) an open range
    ``5:`` stands as its start value."""
    values: list[int] = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        m = _ITEM.fullmatch(item)
        if not m or not (m.group(1) or m.group(3)) or (m.group(2) and not m.group(1)
                                                        and m.group(2) == "-"):
            raise Refusal(f"{what} '{spec}': use {SYNTAX}")
        lo_text, sep, hi_text = m.groups()
        lo = int(lo_text) if lo_text else 0
        if sep is None:
            values.append(lo)
        elif sep == "-":
            if not hi_text:
                raise Refusal(f"{what} '{spec}': use {SYNTAX}")
            values += range(lo, int(hi_text) + 1)
        elif hi_text:
            values += range(lo, int(hi_text))
        elif available is None and open_ends:
            values.append(lo)
        elif available is None:
            raise Refusal(f"{what} '{spec}': an open range '{item}' needs a known end here; "
                             f"give both ends, e.g. {lo}:{lo + 4}")
        else:
            values += range(lo, max(int(v) for v in available) + 1)
    return values


def runs(values: Sequence[int]) -> list[list[int]]:
    """Sorted integers as half-open runs [[lo, hi), ...]."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([int(v), int(v) + 1])
    return out


def expand(rs: Sequence[Sequence[int]]) -> list[int]:
    """Half-open runs back to the integers."""
    return [v for lo, hi in rs for v in range(lo, hi)]


def runs_text(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0:3,5"``: the range syntax for a set of values."""
    return ",".join(f"{a}" if b == a + 1 else f"{a}:{b}" for a, b in runs(sorted(values)))
