"""PDF reports from a store, its analyses and its faithfulness results (no torch).

Three parts: :mod:`.figures` (one module per report section), :mod:`.documents` (the report
PDF, ``build_report(store, out)``, which runs the analyses when their results are missing; the
comparison of several stores) and :mod:`.view` (the interactive HTML view); :mod:`.style` and
:mod:`.summary` are what they share. The PDF names load on first use (matplotlib is slow to
import), so that importing :mod:`.view` alone stays light.
"""

__all__ = ["build_report", "render", "SECTIONS"]


def __getattr__(name: str):
    if name in __all__:
        from .documents import report

        return getattr(report, name)
    raise AttributeError(f"module 'attngeom.reports' has no attribute '{name}'")
