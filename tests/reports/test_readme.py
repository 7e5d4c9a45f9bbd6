"""README.md and the documentation's examples stay true: their Python runs, their commands exist.

README.md's snippet and the Python API page's first block are executed on a small real compact
store (tests/reports/conftest.py), with the demo store's path replaced, the page's second block
(measure in memory) on the tiny llama in place of SmolLM2; the sum of contributions over keys each
prints is checked against the exact identity Σ_j c_ij = 1, and its sink-head count against a
plain numpy count. That every option and variable is documented is checked on the generated
reference (tests/docs/test_generated.py), not here.
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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def page(name: str) -> str:
    return (GUIDE / f"{name}.md").read_text(encoding="utf-8")


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _sink_heads(store) -> tuple[int, int]:
    """(sink heads, heads) by a plain numpy count: mean alpha to key 0 over queries i >= 1."""
    from attngeom.store import open_store

    alpha0 = open_store(store)["alpha"].isel(sink=0).values       # (S, L, H, Q)
    rate = np.nanmean(alpha0[..., 1:], axis=(0, 3))
    return int((rate > 0.3).sum()), rate.size


def test_every_command_is_in_the_readme_table():
    text = readme()
    for name in cli.COMMANDS:
        assert f"| `attngeom {name}" in text, name


def test_readme_snippet_runs_on_a_real_store(compact_store):
    blocks = code_blocks(readme(), "python")
    assert len(blocks) == 1 and "runs/demo/store" in blocks[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0].replace("runs/demo/store", str(compact_store)), "README.md",
                     "exec"), {})                                  # noqa: S102 (our README)
    found, total = _sink_heads(compact_store)
    assert f"{found} sink heads of {total}" in out.getvalue()
    assert re.search(r"sink: alpha \S+ contribution \S+", out.getvalue())


def test_granularity_default_is_the_one_the_guide_gives():
    faith = cli.build_parser(["faithfulness"])
    sub = next(a for a in faith._actions if isinstance(a, argparse._SubParsersAction))
    default = sub.choices["faithfulness"].get_default("granularity")
    assert f"**Default granularity: `{default}`.**" in page("faithfulness")


def test_python_api_example_runs_on_a_real_store(compact_store):
    blocks = code_blocks(page("python-api"), "python")
    assert len(blocks) == 2 and "runs/demo/store" in blocks[0]
    code = blocks[0].replace("runs/demo/store", str(compact_store))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "python-api.md", "exec"), {})          # noqa: S102 (our docs)
    text = out.getvalue()
    from attngeom.store import open_store

    store = open_store(compact_store)
    one = compact_identity(store, store.sizes["query"])             # Σ_j c_ij = 1 exactly
    total = float(re.search(r"sum over keys: (\S+)", text).group(1))
    assert total == one.approx(1.0)

    found, heads = _sink_heads(compact_store)
    assert f"{found} sink heads of {heads}" in text
    assert "pooled_vertex" in text
    parts = float(re.search(r"sink \+ tail \+ middle: (\S+)", text).group(1))
    n = int(store["middle_contribution"].notnull().sum())         # the mean over every query
    assert parts == (one + tol.total(n, 1.0)).approx(1.0)        # the accessor's groups too
    block = float(re.search(r"sink rate of a block: (\S+)", text).group(1))
    assert 0 < block < 1


def test_notebook_example_measures_a_model_in_memory(tiny, tmp_path, monkeypatch):
    """The Python API page's second block: measure -> analysis -> view -> store.write, on the tiny llama in
    place of SmolLM2 (no hub here); its printed sum is the identity, its sink-head count a
    plain numpy count, and the store it writes validates and reads back the same."""
    from attngeom.store import open_store
    from attngeom.store.io.validate import validate

    code = code_blocks(page("python-api"), "python")[1]
    hub_id = re.search(r'name = "([^"]+)"', code).group(1)
    assert hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and "attngeom.measure(" in code
    monkeypatch.chdir(tmp_path)
    out, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(hub_id, str(tiny["model"])), "python-api.md", "exec"),
             scope)                                                # noqa: S102 (our docs)
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
    code = code_blocks(page("store"), "python")[0]
    assert "attngeom" not in code
    monkeypatch.chdir(compact_store.parent)
    scope: dict = {}
    exec(compile(code.replace('"store/', f'"{compact_store.name}/'), "store.md", "exec"),
         scope)                                                    # noqa: S102
    from attngeom.store import open_store

    ref = open_store(compact_store, derived=False)
    np.testing.assert_array_equal(scope["ds"]["value_norm"].values, ref["value_norm"].values)


@pytest.mark.parametrize("target", ["setup", "demo", "test", "test-fast", "bench", "docs"])
def test_make_targets_named_in_the_readme_exist(target):
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^{re.escape(target)}:", makefile, re.M)
    assert f"make {target}" in readme()
