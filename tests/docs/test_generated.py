"""The pages made from the code are current and complete, and the README stays short.

``docs/generate.py`` writes the command-line, store and architecture references, the refusals,
the performance page and every figure cited from the benchmark records. These tests check what
it wrote against the code by other means than the generator's own: every option of every
command is looked up in its command's section, every variable and dimension of the schema in
the store reference's tables, every row of the sweep's results file in the architecture table,
and every citation against the record it names.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


generate = _load(DOCS / "generate.py", "attngeom_docs_generate")
records = generate.records


def test_every_generated_file_is_current():
    stale = [p.relative_to(ROOT).as_posix() for p in generate.stale()]
    assert not stale, f"stale: {stale}; run python docs/generate.py"


def _sections(text: str) -> dict[str, str]:
    """Each ``attngeom ...`` heading of the CLI reference and the text under it (up to the
    next heading)."""
    parts = re.split(r"^#+ `(attngeom[^`]*)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, path + (name,))


def test_cli_reference_has_every_command_and_option():
    from attngeom import cli

    sections = _sections((DOCS / "reference" / "cli.md").read_text(encoding="utf-8"))
    seen = 0
    for name in cli.COMMANDS:
        top = cli.build_parser([name])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        for path, parser in _walk(sub.choices[name], (name,)):
            title = "attngeom " + " ".join(path)
            assert title in sections, f"no section for {title}"
            body = sections[title]
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                if action.option_strings:
                    for flag in action.option_strings:   # aliases too, each as a code span
                        assert re.search(rf"`{re.escape(flag)}(?: [^`]*)?`", body), \
                            (title, flag)
                else:
                    assert f"`{action.metavar or action.dest.upper()}` (positional" in body, \
                        (title, action.dest)
                if action.help:
                    assert action.help.split()[0] in body, (title, action.dest)
                seen += 1
    assert seen > 100       # every command's options, not an empty walk


def test_store_reference_has_every_variable_and_dimension():
    from attngeom.store.format import schema as S

    text = (DOCS / "reference" / "store.md").read_text(encoding="utf-8")

    def rows(section: str) -> dict[str, str]:
        body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        return {line.split("|")[1].strip().split()[0].strip("`"): line
                for line in body.splitlines() if line.startswith("| `")}

    dims, rows = rows("Dimensions"), rows("Variables")
    for name, definition in S.DESCRIPTIONS.items():
        assert name in rows, name
        assert definition.split()[0].replace("|", "\\|") in rows[name], name
    for name in S.DERIVED:
        assert "(derived)" in rows[name], name
    for dim in (S.SEQUENCE, S.LAYER, S.HEAD, S.POSITION, S.QUERY, S.KEY, S.SINK, S.LAG):
        assert dim in dims, dim


def test_architecture_page_is_the_sweep_results_file():
    sweep = json.loads((ROOT / "tests" / "extract" / "archs_sweep.json").read_text())
    text = (DOCS / "reference" / "architectures.md").read_text(encoding="utf-8")
    for row in sweep["rows"]:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{row['architecture']}` |")),
                    None)
        assert line is not None and row["status"] in line, row["architecture"]
    assert f"floor is transformers {generate.floor('transformers')}" in text


def test_citations_are_the_records_values(tmp_path):
    """Every cited figure equals its record's value (recomputed here), and a citation of a
    record or value that does not exist is an error, not a blank."""
    recs = records.load()
    last = {}
    for rec in recs:
        if rec["id"] not in last or rec["date"] >= last[rec["id"]]["date"]:
            last[rec["id"]] = rec
    cited = 0
    for path in generate.cited_files():
        for ident, field, fmt, shown in records.CITE.findall(path.read_text(encoding="utf-8")):
            rec = last[ident]
            want = rec["date"] if field == "date" else rec["values"][field]
            if isinstance(want, list):
                want = "-".join(format(v, fmt) for v in want)
            elif field != "date":
                want = format(want, fmt)
            assert shown == want, (path.name, ident, field, shown, want)
            cited += 1
    assert cited >= 20
    with pytest.raises(KeyError, match="no benchmark record 'nope'"):
        records.cite("<!--rec:nope:x:.1f-->1<!--/rec-->", recs)
    with pytest.raises(KeyError, match="has no value 'nope'"):
        records.cite("<!--rec:demo:nope:.1f-->1<!--/rec-->", recs)


def test_no_line_starts_with_a_citation():
    """A line that starts with ``<!--`` opens an HTML block in Markdown, which ends the paragraph
    (and shows the rest raw on GitHub): a citation must follow text on its line."""
    for path in generate.cited_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not line.startswith("<!--rec:"), f"{path.name}:{n}"


def test_status_table_lists_each_target_once_with_its_latest_record():
    recs = [{"id": "a", "date": "2026-01-01", "target": "t1", "issue": "1", "figure": "old",
             "verdict": "v", "values": {}},
            {"id": "b", "date": "2026-01-02", "values": {"x": 1}},
            {"id": "a", "date": "2026-02-01", "target": "t1", "issue": "1", "figure": "new",
             "verdict": "v", "values": {}}]
    table = records.status_table(recs)
    assert table.count("| t1 (issue 1) |") == 1 and "| new |" in table and "old" not in table
    assert "`b`" not in table
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    targets = {r["target"] for r in records.load() if "target" in r}
    block = text.split(records.STATUS_BEGIN)[1].split(records.STATUS_END)[0]
    assert len(targets) >= 10 and all(t.replace("|", "\\|") in block for t in targets)


def test_readme_is_short_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert sum(link.startswith("docs/") for link in links) >= 15
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_docs_page_is_in_the_site():
    """Every Markdown page under docs/ is reachable from a toctree (Sphinx would warn about an
    orphan, and the warning fails the build, but only where the site is built)."""
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")
             if "_build" not in p.parts}
    listed = {"index"}
    for p in DOCS.rglob("*.md"):
        if "_build" in p.parts:
            continue
        for block in re.findall(r"```\{toctree\}\n(.*?)```", p.read_text(encoding="utf-8"), re.S):
            for line in block.splitlines():
                if line and not line.startswith(":"):
                    target = (p.parent / line.strip()).resolve().relative_to(DOCS.resolve())
                    listed.add(target.as_posix())
    assert pages == listed, (pages - listed, listed - pages)
