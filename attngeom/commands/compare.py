"""``attngeom compare STORE [STORE ...] --out compare.pdf [--csv DIR] [--labels a,b,...]``.

Reads each store's stored analyses (``attngeom analyze``; :func:`attngeom.analysis.compare.
compare`) and writes one PDF: a table with a row per store, per-layer figures on a shared
relative-depth axis, the faithfulness verdicts, and Gu et al.'s Table 1 for probe stores.
"""

from __future__ import annotations

import argparse

from attngeom.common.options.commands import CompareCommand
from attngeom.common.options.spec import add_arguments


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, CompareCommand)


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.analysis.compare import compare
    from attngeom.reports.documents.compare import write_csv, write_pdf

    labels = args.labels.split(",") if args.labels else None
    ds = compare(args.stores, labels, faithfulness=args.faithfulness, loss=args.loss)
    if args.csv:                 # the PDF last: a run stopped before it has not finished
        for f in write_csv(ds, args.csv):
            print(f"attngeom: wrote {f}")
    path = write_pdf(ds, args.out, args.png)
    print(f"attngeom: wrote {path}")
    return 0
