"""Errors tell bugs from mistakes: a refusal is one line with exit status 2, anything else an
internal error with its own status (70) and where to report it; a broken command is an error;
docs/refusals.md lists every refusal the code raises."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from attngeom import cli
from attngeom.common.errors import Refusal

ROOT = Path(__file__).resolve().parents[1]


def _run_raising(monkeypatch, capsys, exc: BaseException) -> tuple[int, list[str]]:
    """``attngeom store info X`` whose work raises ``exc``: (exit status, stderr lines)."""
    from attngeom.commands import store

    def broken(args):
        raise exc
    monkeypatch.setattr(store, "run", broken)
    rc = cli.main(["store", "info", "somewhere"])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_an_internal_error_is_not_reported_as_the_user_s(monkeypatch, capsys):
    rc, lines = _run_raising(monkeypatch, capsys, KeyError("alpha"))
    assert rc == cli.INTERNAL_EXIT == 70 and len(lines) == 1
    assert lines[0].startswith("attngeom: internal error (a bug in attngeom, not in your input)")
    assert "KeyError: 'alpha'" in lines[0] and "--debug" in lines[0] and "report" in lines[0]
    for other in (ValueError("operands could not be broadcast"), TypeError("x"),
                  IndexError("y")):
        assert _run_raising(monkeypatch, capsys, other)[0] == 70, other


def test_a_refusal_is_the_user_s_one_line(monkeypatch, capsys):
    rc, lines = _run_raising(monkeypatch, capsys, Refusal("the store is X; use Y"))
    assert rc == 2 and lines == ["attngeom: error: the store is X; use Y"]
    rc, lines = _run_raising(monkeypatch, capsys, OSError("disk quota exceeded"))
    assert rc == 2 and lines == ["attngeom: error: disk quota exceeded"]


def test_a_broken_command_is_an_error_not_a_missing_one(monkeypatch, capsys):
    real = importlib.import_module

    def import_module(name, *args):
        if name == "attngeom.commands.view":
            raise ImportError("cannot import name 'build' from 'attngeom.reports.view'")
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", import_module)
    rc = cli.main(["view", "STORE", "--out", "v.html"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 70 and len(err) == 1 and "ImportError" in err[0] and "internal error" in err[0]


def test_the_list_of_refusals_is_current():
    run = subprocess.run([sys.executable, str(ROOT / "docs" / "refusals.py")],
                         capture_output=True, text=True, check=True)
    assert run.stdout == (ROOT / "docs" / "refusals.md").read_text(), (
        "docs/refusals.md is out of date: python docs/refusals.py > docs/refusals.md")
    assert "unknown model spec" in run.stdout and "the manifest disagrees" in run.stdout


def test_the_refusal_lister_finds_derived_classes(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        refusals = importlib.import_module("refusals")
    finally:
        sys.path.remove(str(ROOT / "docs"))
    classes = {cls for _, _, cls, _ in refusals.refusals()}
    assert {"Refusal", "StoreError", "Unsupported"} <= classes


@pytest.mark.parametrize("code", ["raise KeyError('x')", "raise ValueError('x')"])
def test_debug_shows_the_traceback_of_an_internal_error(code, monkeypatch, capsys):
    from attngeom.commands import store

    def broken(args):
        exec(code)
    monkeypatch.setattr(store, "run", broken)
    with pytest.raises((KeyError, ValueError)):
        cli.main(["--debug", "store", "info", "somewhere"])


class _Named:
    """A descriptor whose ``__set_name__`` is where a signal arrives (as a class is defined)."""

    def __init__(self, interrupt: type[BaseException]):
        self.interrupt = interrupt

    def __set_name__(self, owner, name):
        raise self.interrupt


def _interrupted_class_definition(interrupt: type[BaseException]) -> BaseException:
    """What Python 3.11 raises when an interrupt arrives inside ``__set_name__`` (a dataclass
    defined while a module imports): a RuntimeError caused by it (3.12 raises it as is)."""
    try:
        type("Spec", (), {"field": _Named(interrupt)})
    except BaseException as exc:               # noqa: BLE001 - RuntimeError or the interrupt
        return exc
    raise AssertionError("the class was defined")


@pytest.mark.parametrize("interrupt, status", [(cli.Terminated, 143), (KeyboardInterrupt, 130)])
def test_an_interrupt_wrapped_by_python_is_an_interrupt_not_a_bug(interrupt, status,
                                                                  monkeypatch, capsys):
    """SIGTERM three seconds into `attngeom analyze` once met formulaic's dataclasses being
    defined: exit 70 and "internal error" instead of 143 and the interrupted line."""
    rc, lines = _run_raising(monkeypatch, capsys, _interrupted_class_definition(interrupt))
    assert rc == status and lines[-1].startswith("attngeom: interrupted"), (rc, lines)
    assert not any("internal error" in line for line in lines), lines


def test_an_interrupt_while_a_command_is_imported_is_an_interrupt(monkeypatch, capsys):
    real = importlib.import_module

    def import_module(name, *args):
        if name == "attngeom.commands.analyze":
            raise _interrupted_class_definition(cli.Terminated)
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", import_module)
    rc = cli.main(["analyze", "STORE", "--out", "somewhere"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 143 and err[-1].startswith("attngeom: interrupted"), (rc, err)
