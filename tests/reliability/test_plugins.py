"""A metric plugin that fails to load is named in one line and left out; built-in work goes on.

Two installed distributions are faked on ``sys.path`` (a ``*.dist-info`` folder each, with
an ``attngeom.metrics`` entry point): one whose module cannot be imported, one that works
(tests/user_metric.py's ``value_norm``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attngeom.store.format import metrics as M
from reliability.rel_helpers import cli_main

FAITH = ("--ranks", "signed", "--fractions", "0.5", "--limit", "2", "--batch-size", "2",
         "--max-length", "8", "--quiet")


def _distribution(folder: Path, name: str, entry: str) -> None:
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[attngeom.metrics]\n{name} = {entry}\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text(
        "import a_dependency_that_is_not_installed\n\ndef register():\n    pass\n")
    (tmp_path / "good_plugin.py").write_text(
        "def register():\n    from attngeom.store.format.metrics import register\n"
        "    import user_metric\n    register(user_metric.ENTRY)\n")
    _distribution(tmp_path, "broken_plugin", "broken_plugin:register")
    _distribution(tmp_path, "good_plugin", "good_plugin:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(M._PLUGINS, "loaded", False)
    monkeypatch.setitem(M._PLUGINS, "failed", {})
    yield
    M.unregister("value_norm")


def test_a_broken_plugin_is_named_and_left_out(plugins, tiny_model, texts, tmp_path):
    rc, _, err = cli_main("faithfulness", "--model", tiny_model, "--data", texts,
                          "--metrics", "contribution,value_norm", *FAITH,
                          "--out", tmp_path / "out")
    assert rc == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "metric plugin 'broken_plugin'" in lines[0] and "left out" in lines[0]
    assert "a_dependency_that_is_not_installed" in lines[0]
    assert set(M.failed_plugins()) == {"broken_plugin"}
    assert "value_norm" in M.names()                          # the good plugin still loads


def test_asking_for_a_metric_of_nothing_registered_is_the_error(plugins, tiny_model, texts,
                                                                 tmp_path):
    with pytest.raises(ValueError, match="unknown metric 'its_metric'.*plugin 'broken_plugin' "
                                         "failed to load"):
        M.get("its_metric")
    rc, _, err = cli_main("faithfulness", "--model", tiny_model, "--data", texts,
                          "--metrics", "its_metric", *FAITH, "--out", tmp_path / "out")
    last = err.strip().splitlines()[-1]                 # the command line names the plugin too
    assert rc == 2 and "its_metric" in last, err
    assert "plugin 'broken_plugin' failed to load" in last, err
    assert not (tmp_path / "out").exists()
