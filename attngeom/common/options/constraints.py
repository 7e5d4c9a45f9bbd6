"""What a value of an option may be: each constraint an object whose text is the help text's
range and whose :meth:`~Constraint.problem` is the error message (after scikit-learn's
``utils/_param_validation.py``).

:func:`attngeom.common.options.spec.option` makes one from its ``at_least``, ``within`` and
``choices``; the command line (argparse, exit status 2) and every ``check()`` refuse a value
through it, naming the option, the value and what it may be.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


class Constraint:
    """Any value: the base of the constraints below."""

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (the message after the option's flag), or None."""
        return None

    def __str__(self) -> str:
        return ""


class AtLeast(Constraint):
    """An integer of at least ``low``."""

    def __init__(self, low: int):
        self.low = low

    def problem(self, value: Any) -> str | None:
        if not (isinstance(value, int) and not isinstance(value, bool)):
            return f"must be an integer of at least {self.low}, not {value!r}"
        return f"must be at least {self.low}, not {value}" if value < self.low else None

    def __str__(self) -> str:
        return f"at least {self.low}"


class Interval(Constraint):
    """A number in ``(lo, hi)``, ``[lo, hi]``, ... (``ends``: the brackets)."""

    def __init__(self, lo: float, hi: float, ends: str):
        if ends not in ("()", "(]", "[)", "[]"):
            raise ValueError(f"ends={ends!r}: one of (), (], [), []")
        self.lo, self.hi, self.ends = lo, hi, ends

    def holds(self, value: Any) -> bool:
        if not is_number(value):
            return False
        low = self.lo <= value if self.ends[0] == "[" else self.lo < value
        return low and (value <= self.hi if self.ends[1] == "]" else value < self.hi)

    @property
    def brackets(self) -> str:
        """``(0, 1]`` and the like."""
        return f"{self.ends[0]}{self.lo:g}, {self.hi:g}{self.ends[1]}"

    def problem(self, value: Any) -> str | None:
        return None if self.holds(value) else f"{value} must be {self}"

    def __str__(self) -> str:
        return f"in {self.brackets}"


class OneOf(Constraint):
    """One of ``choices`` (or of what ``choices()`` returns, for lists that grow at run time:
    the metric registry)."""

    def __init__(self, choices: Sequence | Callable[[], Sequence],
                 note: Callable[[], str] | None = None):
        self._choices = choices if callable(choices) else tuple(choices)
        self._note = note

    @property
    def choices(self) -> tuple:
        return tuple(self._choices()) if callable(self._choices) else self._choices

    def note(self) -> str:
        """Why a choice may be missing (a plugin that failed to load), appended to the error."""
        return self._note() if self._note is not None else ""

    def problem(self, value: Any) -> str | None:
        if value in self.choices:
            return None
        return f"must be one of {', '.join(map(str, self.choices))}, not '{value}'{self.note()}"


class Items(Constraint):
    """A non-empty list of distinct items, each allowed by ``each`` (``names``: from a
    :class:`OneOf`; ``numbers``: in an :class:`Interval`)."""

    def __init__(self, each: Constraint, numbers: bool):
        self.each, self.numbers = each, numbers

    def problem(self, values: Any) -> str | None:
        values = tuple(values)
        ok = bool(values) and len(set(values)) == len(values) and all(
            (is_number(v) or not self.numbers) and self.each.problem(v) is None
            for v in values)
        if ok:
            return None
        if self.numbers:
            within = self.each.brackets if isinstance(self.each, Interval) else "(-inf, inf)"
            return (f"'{_show(values)}': give distinct numbers in {within}, e.g. 0.1,0.2,0.5")
        one_of = self.each if isinstance(self.each, OneOf) else None
        choices, note = (one_of.choices, one_of.note()) if one_of else ((), "")
        return (f"{','.join(map(str, values))}: give distinct values from {', '.join(choices)}"
                f"{note}")

    def __str__(self) -> str:
        return f"each {self.each}" if self.numbers and str(self.each) else ""
