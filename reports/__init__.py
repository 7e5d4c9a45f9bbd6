"""PDF reports from a store, its analyses and its faithfulness results (no torch).

``build_report(store, out)`` runs the analyses when their results are missing and writes the
report; see :mod:`.pdf` for the document and the ``figures_*`` modules for each section.
:mod:`.view` is the interactive HTML view. The PDF names load on first use (matplotlib is
slow to import), so that importing :mod:`.view` alone stays light.
"""

__all__ = ["build_report", "render", "SECTIONS"]


def __getattr__(name: str):
    if name in __all__:
        from . import pdf

        return getattr(pdf, name)
    raise AttributeError(f"module 'attngeom.reports' has no attribute '{name}'")
