"""Sphinx configuration of the attngeom documentation (``make docs``).

The site builds offline: no intersphinx, no remote images or fonts, tutorials executed on the
small models ``make setup`` installs. Warnings are errors (``-W`` in the Makefile). Pages made
from the code are written by ``docs/generate.py`` before Sphinx runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import attngeom  # noqa: E402

project = "attngeom"
author = "the attngeom developers"
copyright = "2026, the attngeom developers"
version = release = attngeom.__version__

extensions = [
    "myst_nb",                      # MyST Markdown pages and executed notebooks
    "sphinx.ext.autodoc",
    "numpydoc",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "refusals.py", "generate.py",
                    "conf.py", "tutorials/_work"]

# MyST: ::: fences, heading anchors for links between pages
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# notebooks: every code cell runs when the site builds, in docs/_build/work (below), and a
# cell that raises fails the build; each page gets its own fresh kernel
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_show_tb = True
nb_merge_streams = True
nb_execution_in_temp = False
nb_output_stderr = "remove"     # progress bars and transformers' notes; errors still fail

# the API reference: numpydoc docstrings, validated (every check but those listed)
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks = {
    "all",
    "ES01",   # an extended summary is optional
    "EX01",   # examples live in the tutorials and the guide
    "SA01",   # no See Also required
    "PR08", "PR09", "RT05",   # descriptions may start with a symbol or a lowercase name
}

# the PyData theme, no external resources
html_theme = "pydata_sphinx_theme"
html_title = "attngeom"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
    "secondary_sidebar_items": ["page-toc"],
    "use_edit_page_button": False,
}
html_sidebars = {"index": [], "readme-map": []}
html_copy_source = False
html_show_sourcelink = False
suppress_warnings = ["mystnb.unknown_mime_type"]

# the tutorials' working folder: their stores, exports and figures (kept between builds only
# while the sources are unchanged: a new build starts from an empty folder)
WORK = ROOT / "docs" / "_build" / "work"
WORK.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("ATTNGEOM_DOCS_WORK", str(WORK))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")      # no hub at build time
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# the tutorials' `attngeom` commands: this environment's, also when its bin/ is not on PATH
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
