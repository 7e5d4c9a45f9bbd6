"""How an option is declared, and what is made from the declarations.

:func:`option` declares one option as a dataclass field (default, help, flag, kind, choices,
bounds, where a store records it); :func:`add_arguments` and :func:`from_args` turn a stage's
dataclass into argparse arguments and back; :func:`check_fields` checks an object against its
declarations; :func:`identity`, :func:`mismatches` and :func:`provenance` give the options that
shape the numbers. The stages themselves are declared in :mod:`attngeom.store.options.stages`.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import textwrap
from dataclasses import field, fields
from typing import Any, Callable, Sequence

from .constraints import AtLeast, Constraint, Interval, Items, OneOf
from .ranges import SYNTAX, check_syntax
from ..errors import Refusal

LISTS = ("names", "numbers")        # comma-separated on the command line, tuples in Python
KINDS = (None, "flag", "negated", "ranges") + LISTS


# ----------------------------------------------------------------------------- declaring
def option(default: Any, help: str, *, flag: str | None = None, aliases: Sequence[str] = (),
           kind: str | None = None, type: Callable | None = None,
           choices: Sequence | None = None, choices_note: Callable[[], str] | None = None,
           at_least: int | None = None,
           within: tuple[float, float, str] | None = None, record: str | None = None,
           auto: bool = False, provenance: bool = False, positional: bool = False,
           required: bool = False, metavar: str | None = None, cli: bool = True,
           omit_default: bool = False, nargs: str | None = None) -> Any:
    """A dataclass field declaring one option.

    Parameters
    ----------
    default, help : the default value and the help text (the default is appended to it).
    flag, aliases : the command-line flag (default ``--field-name``) and other spellings.
    kind : None (one value of ``type``), ``"flag"`` (``--x`` sets True), ``"negated"``
        (``--no-x`` sets False), ``"names"``/``"numbers"`` (comma-separated, a tuple),
        ``"ranges"`` (the range syntax of :mod:`attngeom.store.options.ranges`).
    type : the command line's converter (default: the type of ``default``).
    choices : allowed values (of each item for ``names``), or a function returning them when
        they can grow at run time (the metric registry); choices_note : a function whose
        text is appended to the error for a value not among them (why it may be missing).
    at_least : the smallest allowed integer; within : ``(lo, hi, "[]")``, the interval a number
        (each number for ``numbers``) must lie in, brackets ``(``/``[`` for open/closed ends.
        Every numeric option declares one of them; both the command line (argparse, exit 2)
        and ``check()`` refuse a value outside it, naming the option, the value and the range.
    record : where a store's manifest records the option (``"options"`` or ``"data"`` of its
        config): it shapes the numbers and is part of the store's identity. auto : None lets
        the run choose the value (it records the chosen one; any recorded value matches None).
        omit_default : recorded only when not the default (an option added later: stores
        made before it keep their identity, and absent reads as the default).
    provenance : copied into analysis results as ``analysis_<name>``.
    positional, required, metavar, nargs, cli : argparse details; ``cli=False``: Python API
        only.
    """
    if kind not in KINDS:
        raise Refusal(f"unknown option kind {kind!r}")
    meta = dict(help=help, flag=flag, aliases=tuple(aliases), kind=kind, type=type,
                constraint=_constraint(kind, choices, choices_note, at_least, within),
                record=record,
                auto=auto, provenance=provenance, positional=positional, required=required,
                metavar=metavar, cli=cli, omit_default=omit_default, nargs=nargs)
    return field(default=default, metadata=meta)


def _constraint(kind, choices, note, at_least, within) -> Constraint:
    """The :mod:`.constraints` object of an option's declared choices and bounds."""
    each = (OneOf(choices, note) if choices is not None else AtLeast(at_least)
            if at_least is not None else Interval(*within) if within is not None
            else Constraint())
    return Items(each, numbers=kind == "numbers") if kind in LISTS else each


def _choices(m: dict) -> tuple | None:
    """The declared choices (called when declared as a function), or None."""
    c = m["constraint"]
    c = c.each if isinstance(c, Items) else c
    return c.choices if isinstance(c, OneOf) else None


def flag_of(f: dataclasses.Field) -> str:
    """``--max-length`` for the field ``max_length`` (or its declared flag)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def _rst(text: str) -> str:
    """A help text as reStructuredText: code in double backticks, markup characters escaped."""
    text = text.replace("``", "`").replace("`", "``")
    text = text.replace("*", "\\*").replace("|", "\\|")
    return re.sub(r"(\w)_(?=\W|$)", r"\1\\_", text)


def documented(cls: type) -> type:
    """Append to the docstring of the options class ``cls`` a numpydoc Parameters section made
    from its declarations (help, default, command-line flag), so that the API reference and
    ``--help`` say the same, typed once."""
    lines = ["", "Parameters", "----------"]
    for f in fields(cls):
        m = f.metadata
        if "help" not in m:
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        text = ("False: " if m["kind"] == "negated" else "") + m["help"]
        text += "" if text.endswith(".") else "."
        if "default" not in text.lower():
            text += f" Default ``{_show(f.default)}``."
        if m["cli"]:
            text += f" Command line: ``{flag_of(f)}``."
        lines.append(f"{f.name} : {kind}")
        lines += textwrap.wrap(_rst(text), 88, initial_indent="    ", subsequent_indent="    ",
                               break_on_hyphens=False, break_long_words=False)
    cls.__doc__ = inspect.cleandoc(cls.__doc__ or "") + "\n" + "\n".join(lines) + "\n"
    return cls


# ----------------------------------------------------------------------------- argparse
def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}': give comma-separated numbers such as 0.1,0.2,0.5") from None


def _ranges(what: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        try:
            return check_syntax(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def add_arguments(parser: argparse.ArgumentParser, cls: type, only: Sequence[str] | None = None,
                  defaults: dict | None = None) -> None:
    """Add the options of the dataclass ``cls`` to ``parser``.

    ``only``: these fields, in this order (default: every field with ``cli``); ``defaults``:
    other defaults for this command (``attngeom run`` uses smaller ones).
    """
    by_name = {f.name: f for f in fields(cls)}
    names = list(only) if only is not None else [f.name for f in fields(cls) if f.metadata["cli"]]
    for name in names:
        f = by_name[name]
        default = (defaults or {}).get(name, f.default)
        parser.add_argument(*_spellings(f), **_argparse_kwargs(f, default))


def _spellings(f: dataclasses.Field) -> tuple[str, ...]:
    return (f.name,) if f.metadata["positional"] else (flag_of(f), *f.metadata["aliases"])


def _argparse_kwargs(f: dataclasses.Field, default: Any) -> dict:
    m = f.metadata
    kind, help_text = m["kind"], m["help"]
    if m["kind"] == "names" and _choices(m):
        help_text += f"; from {', '.join(_choices(m))}"
    shown = []
    if default is not None and kind not in ("flag", "negated") and not m["required"]:
        shown.append(f"default {_show(default)}")
    if str(m["constraint"]):
        shown.append(str(m["constraint"]))
    if shown:
        help_text += f" ({'; '.join(shown)})"
    kw: dict = dict(help=help_text)
    if not m["positional"]:
        kw["dest"] = f.name
    if kind == "flag":
        return dict(kw, action="store_true")
    if kind == "negated":
        return dict(kw, action="store_false")
    kw["default"] = default
    if m["nargs"]:
        kw["nargs"] = m["nargs"]
    if m["required"] and not m["positional"]:
        kw["required"] = True
    if m["metavar"] or (m["flag"] and not m["positional"]):
        kw["metavar"] = m["metavar"] or m["flag"].lstrip("-").replace("-", "_").upper()
    if kind == "names":
        kw["type"] = _names
    elif kind == "numbers":
        kw["type"] = _checked(_numbers, m["constraint"].problem)
    elif kind == "ranges":
        kw["type"] = _ranges(flag_of(f))
    else:
        kw["type"] = m["type"] or (type(default) if default is not None else str)
        if isinstance(m["constraint"], (AtLeast, Interval)):
            kw["type"] = _checked(kw["type"], m["constraint"].problem)
        if _choices(m):
            kw["choices"] = list(_choices(m))
    return kw


def _checked(convert: Callable[[str], Any],
             problem: Callable[[Any], str | None]) -> Callable[[str], Any]:
    """``convert`` followed by the declared bounds: a value outside them is argparse's one-line
    usage error ``argument --x: <problem>`` (exit status 2)."""
    def converter(text: str) -> Any:
        value = convert(text)
        found = problem(value)
        if found:
            raise argparse.ArgumentTypeError(found)
        return value
    # argparse names the converter in "invalid int value: 'ten'"
    converter.__name__ = getattr(convert, "__name__", "value")
    return converter


def from_args(args: argparse.Namespace, cls: type, **overrides) -> Any:
    """The ``cls`` object of parsed ``args``: fields the command has, the rest their default;
    ``overrides`` win over both."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


# ----------------------------------------------------------------------------- checking
def check_fields(obj: Any) -> None:
    """ValueError naming the first option of ``obj`` outside its declared choices or bounds."""
    for f in fields(obj):
        value, m = getattr(obj, f.name), f.metadata
        if value is None:
            continue
        if m["kind"] == "ranges":
            _check_ranges(flag_of(f), value)
            continue
        problem = m["constraint"].problem(tuple(value) if m["kind"] in LISTS else value)
        if problem:
            raise Refusal(f"{flag_of(f)} {problem}")


def _check_ranges(what: str, value: Any) -> None:
    if isinstance(value, str):
        check_syntax(value, what)
    elif not all(isinstance(v, int) and v >= 0 for v in value) or not value:
        raise Refusal(f"{what} {value}: give non-negative integers or {SYNTAX}")


# ----------------------------------------------------------------------------- identity
def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def identity(obj: Any, where: str | None = None) -> dict:
    """The options of ``obj`` that shape the numbers (declared with ``record``), as JSON
    values; ``where``: only those recorded there (``"options"`` or ``"data"``)."""
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)
            if f.metadata["record"] and where in (None, f.metadata["record"])
            and not (f.metadata["omit_default"] and getattr(obj, f.name) == f.default)}


def mismatches(obj: Any, config: dict) -> list[str]:
    """Options of ``obj`` whose value differs from the ``config`` a store recorded, as
    ``"name: recorded -> requested"`` (empty: the same). An ``auto`` option left None
    matches any recorded value."""
    out = []
    for f in fields(obj):
        where = f.metadata["record"]
        if not where:
            continue
        want = _plain(getattr(obj, f.name))
        absent = _plain(f.default) if f.metadata["omit_default"] else "(absent)"
        have = (config.get(where) or {}).get(f.name, absent)
        if want is None and f.metadata["auto"]:
            continue
        if have != want:
            out.append(f"{f.name}: {have!r} -> {want!r}")
    return out


def provenance(obj: Any, **resolved) -> dict:
    """The options declared with ``provenance``, ``resolved`` values replacing the requested
    ones (e.g. the store's sink_k for None)."""
    return {f.name: resolved.get(f.name, getattr(obj, f.name)) for f in fields(obj)
            if f.metadata["provenance"]}
