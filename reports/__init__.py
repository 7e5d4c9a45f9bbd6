"""PDF reports from a store, its analyses and its faithfulness results (no torch).

``build_report(store, out)`` runs the analyses when their results are missing and writes the
report; see :mod:`.pdf` for the document and the ``figures_*`` modules for each section.
"""

from .pdf import SECTIONS, build_report, render

__all__ = ["build_report", "render", "SECTIONS"]
