"""The analyses' docstrings, whose shared parameters are filled in from one wording
(``analysis._common.shared_docs``): each documents every parameter of its signature, in order,
and no placeholder is left."""

from __future__ import annotations

import inspect
import re

import pytest

import attngeom.analysis as A
from attngeom.analysis._common import shared_docs

FUNCTIONS = [A.sinks, A.convexity, A.anti_alignment, A.decomposition, A.run_all]


def _documented(doc: str) -> list[str]:
    """The names of the numpydoc Parameters section of ``doc``."""
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\n", 1)[0]
    return [m.group(1).lstrip("*") for m in re.finditer(r"^(\**\w+)(?: :|$)", section, re.M)]


@pytest.mark.parametrize("func", FUNCTIONS, ids=lambda f: f.__name__)
def test_every_parameter_documented_in_order(func):
    doc = inspect.getdoc(func)
    assert _documented(doc) == list(inspect.signature(func).parameters), func.__name__
    assert not re.search(r"^\s*\{[\w, ]+\}\s*$", doc, re.M), "a placeholder left"
    assert "Returns\n-------\n" in doc


def test_placeholders_take_the_marker_line_indent_and_unknown_names_fail():
    def f():
        """One line.

        Parameters
        ----------
        {progress, block_elements}
        """

    text = shared_docs(f).__doc__
    assert "\n        progress : bool\n            Show a progress bar.\n" in text
    assert "\n        block_elements : int\n" in text

    def g():
        """One line.

        {no_such_parameter}
        """

    with pytest.raises(KeyError, match="no_such_parameter"):
        shared_docs(g)
