"""README.md stays true: its Python examples run, every command, option and variable is in it.

The Python API's first block is executed on a small real compact store
(tests/reports/conftest.py), with the demo store's path replaced, the second (measure in
memory) on the tiny llama in place of SmolLM2; the sum of contributions over keys each prints is
checked against the exact identity Σ_j c_ij = 1, and its sink-head count against a plain numpy
count.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

import tolerance as tol
from attngeom import cli
from store_helpers import compact_identity
from attngeom.store.format import schema as S

README = Path(__file__).resolve().parents[2] / "README.md"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(title: str) -> str:
    text = readme().split(f"\n## {title}\n", 1)[1]
    return text.split("\n## ", 1)[0]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def options(parser: argparse.ArgumentParser, path=()):
    """(subcommand path, option strings) of every option of ``parser``, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, path + (name,))
        elif action.option_strings and "--help" not in action.option_strings:
            yield path, action.option_strings


def test_every_command_and_option_is_documented():
    text = readme()
    for name in cli.COMMANDS:
        assert f"attngeom {name}" in text, name
        for path, strings in options(cli.build_parser([name])):
            assert any(re.search(re.escape(s) + r"(?![\w-])", text) for s in strings), \
                (name, path, strings)
    for action in ("info", "validate", "merge", "subset", "export"):
        assert f"attngeom store {action} " in text, action
    assert "--scheduler local:4" in text and "tcp://host:8786" in text


def test_every_store_variable_is_defined_in_the_readme():
    table = section("The store")
    for name in S.DESCRIPTIONS:
        row = next((ln for ln in table.splitlines() if ln.startswith("|")
                    and f"`{name}`" in ln.split("|")[1]), None)
        assert row is not None, name
    for dim in (S.SEQUENCE, S.LAYER, S.HEAD, S.POSITION, S.QUERY, S.KEY, S.SINK, S.LAG):
        assert f"`{dim}`" in table, dim


def test_granularity_default_is_the_one_the_readme_gives():
    faith = cli.build_parser(["faithfulness"])
    sub = next(a for a in faith._actions if isinstance(a, argparse._SubParsersAction))
    default = sub.choices["faithfulness"].get_default("granularity")
    assert f"**Default granularity: `{default}`.**" in section("Faithfulness")


def test_python_api_example_runs_on_a_real_store(compact_store):
    blocks = code_blocks(section("Python API"), "python")
    assert len(blocks) == 2 and "runs/demo/store" in blocks[0]
    code = blocks[0].replace("runs/demo/store", str(compact_store))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})              # noqa: S102 (our README)
    text = out.getvalue()
    from attngeom.store import open_store

    store = open_store(compact_store)
    one = compact_identity(store, store.sizes["query"])             # Σ_j c_ij = 1 exactly
    total = float(re.search(r"sum over keys: (\S+)", text).group(1))
    assert total == one.approx(1.0)

    alpha0 = open_store(compact_store)["alpha"].isel(sink=0).values   # (S, L, H, Q)
    rate = np.nanmean(alpha0[..., 1:], axis=(0, 3))
    assert f"{int((rate > 0.3).sum())} sink heads of {rate.size}" in text
    assert "pooled_vertex" in text
    parts = float(re.search(r"sink \+ tail \+ middle: (\S+)", text).group(1))
    n = int(store["middle_contribution"].notnull().sum())         # the mean over every query
    assert parts == (one + tol.total(n, 1.0)).approx(1.0)        # the accessor's groups too
    block = float(re.search(r"sink rate of a block: (\S+)", text).group(1))
    assert 0 < block < 1


def test_notebook_example_measures_a_model_in_memory(tiny, tmp_path, monkeypatch):
    """The second block: measure -> analysis -> view -> store.write, on the tiny llama in
    place of SmolLM2 (no hub here); its printed sum is the identity, its sink-head count a
    plain numpy count, and the store it writes validates and reads back the same."""
    from attngeom.store import open_store
    from attngeom.store.io.validate import validate

    code = code_blocks(section("Python API"), "python")[1]
    hub_id = re.search(r'name = "([^"]+)"', code).group(1)
    assert hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and "attngeom.measure(" in code
    monkeypatch.chdir(tmp_path)
    out, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(hub_id, str(tiny["model"])), "README.md", "exec"),
             scope)                                                # noqa: S102 (our README)
    text, ds = out.getvalue(), scope["ds"]
    assert float(re.search(r"sum over keys: (\S+)", text).group(1)) == compact_identity(
        ds, ds.sizes["query"]).approx(1.0)
    rate = np.nanmean(ds["alpha"].isel(sink=0).values[..., 1:], axis=(0, 3))   # (L, H)
    assert f"{int((rate > 0.3).sum())} sink heads" in text
    assert "<script>" in (tmp_path / "view.html").read_text(encoding="utf-8")
    assert validate(tmp_path / "notes-store") == []
    again = open_store(tmp_path / "notes-store")
    assert again.attrs["config_hash"] == ds.attrs["config_hash"]
    np.testing.assert_array_equal(again["contribution"].values, ds["contribution"].values)


def test_plain_xarray_snippet_opens_the_store(compact_store, monkeypatch):
    code = code_blocks(section("The store"), "python")[0]
    assert "attngeom" not in code
    monkeypatch.chdir(compact_store.parent)
    scope: dict = {}
    exec(compile(code.replace('"store/', f'"{compact_store.name}/'), "README.md", "exec"),
         scope)                                                    # noqa: S102
    from attngeom.store import open_store

    ref = open_store(compact_store, derived=False)
    np.testing.assert_array_equal(scope["ds"]["value_norm"].values, ref["value_norm"].values)


@pytest.mark.parametrize("target", ["setup", "demo", "test", "test-fast", "bench"])
def test_make_targets_named_in_the_readme_exist(target):
    makefile = (README.parent / "Makefile").read_text()
    assert re.search(rf"^{re.escape(target)}:", makefile, re.M)
    assert f"make {target}" in readme()
