"""The benchmark records: ``benchmarks/records.jsonl``, one measured result per line.

A record is a JSON object with ``id`` (what was measured; a later record of the same id
supersedes an earlier one), ``date``, ``command`` (how it was measured), ``values`` (the
figures, numbers) and, for a performance target, ``target``, ``issue``, ``figure`` (the figure
in words) and ``verdict``. Benchmarks append records (``bench_demo.py --record``); the status
table of ``benchmarks/RESULTS.md``, the documentation's Performance page and every figure that
README.md or a documentation page cites with a marker are generated from them by
``python docs/generate.py``, so a figure stated anywhere is the record's.

A citation in a Markdown file is ``<!--rec:ID:FIELD:FORMAT-->VALUE<!--/rec-->``: the latest
record ``ID``'s ``values[FIELD]`` formatted with ``FORMAT`` (Python's format spec, e.g.
``.0f``; a list of values is cited as a range, ``low-high``); ``FIELD`` ``date`` cites the
record's date.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FILE = Path(__file__).resolve().parent / "records.jsonl"
CITE = re.compile(r"<!--rec:([\w.-]+):(\w+):([^>]*?)-->(.*?)<!--/rec-->", re.S)
STATUS_BEGIN, STATUS_END = "<!-- status:begin -->", "<!-- status:end -->"


def load(path: Path = FILE) -> list[dict]:
    """Every record, in file order."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def append(record: dict, path: Path = FILE) -> None:
    """Add one record at the end of the file."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def latest(records: list[dict]) -> dict[str, dict]:
    """The latest record of each id (by date, then file order), in order of first appearance."""
    out: dict[str, dict] = {}
    for rec in records:
        old = out.get(rec["id"])
        if old is None or rec["date"] >= old["date"]:
            out[rec["id"]] = rec
    return out


def value(rec: dict, field: str, fmt: str) -> str:
    """One cited figure of a record."""
    if field == "date":
        return rec["date"]
    v = rec["values"][field]
    if isinstance(v, list):                      # a range: low-high
        return "-".join(format(x, fmt) for x in v)
    return format(v, fmt)


def cite(text: str, records: list[dict]) -> str:
    """``text`` with every citation marker's value filled from the latest records; a marker
    naming an unknown record or field is a KeyError naming it."""
    last = latest(records)

    def fill(m: re.Match) -> str:
        ident, field, fmt = m.group(1), m.group(2), m.group(3)
        if ident not in last:
            raise KeyError(f"no benchmark record {ident!r} in {FILE.name}")
        if field != "date" and field not in last[ident]["values"]:
            raise KeyError(f"benchmark record {ident!r} has no value {field!r}")
        return f"<!--rec:{ident}:{field}:{fmt}-->{value(last[ident], field, fmt)}<!--/rec-->"

    return CITE.sub(fill, text)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def status_table(records: list[dict]) -> str:
    """The Markdown status table: each target's latest figure and verdict."""
    rows = ["| target (issue) | latest figure | verdict | record |", "|---|---|---|---|"]
    for rec in latest(records).values():
        if "target" not in rec:
            continue
        rows.append(f"| {_cell(rec['target'])} (issue {rec['issue']}) | {_cell(rec['figure'])} "
                    f"| {_cell(rec['verdict'])} | `{rec['id']}`, {rec['date']} |")
    return "\n".join(rows)


def with_status(text: str, records: list[dict]) -> str:
    """A Markdown text (RESULTS.md) with its status block regenerated."""
    pattern = re.escape(STATUS_BEGIN) + r"\n.*?" + re.escape(STATUS_END)
    if not re.search(pattern, text, re.S):
        raise KeyError(f"no {STATUS_BEGIN} ... {STATUS_END} block")
    table = status_table(records)
    return re.sub(pattern, lambda m: f"{STATUS_BEGIN}\n{table}\n{STATUS_END}", text, flags=re.S)
