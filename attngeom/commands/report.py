"""``attngeom report STORE [--analysis DIR] [--out report.pdf]``: the PDF report of a store.

Runs the analyses first when their results are missing from DIR (default ``STORE/analysis``),
with ``--epsilon``, ``--bootstrap``, ``--seed`` and ``--level``; shows the faithfulness results
the store's manifest records, and leaves out, with a line saying why, any section whose data is
missing.
"""

from __future__ import annotations

import argparse

from attngeom.common.options.commands import ReportCommand
from attngeom.common.options.stages import (REPORT_ANALYSIS, AnalysisOptions, add_arguments,
                                            from_args)


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, ReportCommand)
    add_arguments(p, AnalysisOptions, only=REPORT_ANALYSIS)


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.reports import build_report

    cmd, options = from_args(args, ReportCommand), from_args(args, AnalysisOptions)
    options.check()
    path = build_report(cmd.store, cmd.out, cmd.analysis, faithfulness=cmd.faithfulness,
                        progress=not cmd.quiet, options=options)
    print(f"attngeom: wrote {path}")
    return 0
