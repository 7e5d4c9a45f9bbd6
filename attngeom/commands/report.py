"""``attngeom report STORE [--analysis DIR] [--out report.pdf]``: the PDF report of a store.

Runs the analyses first when their results are missing from DIR (default ``STORE/analysis``),
shows the faithfulness results the store's manifest records, and leaves out, with a line saying
why, any section whose data is missing.
"""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="store directory written by `attngeom extract`")
    p.add_argument("--out", default=None, help="the PDF to write (default STORE/report.pdf)")
    p.add_argument("--analysis", default=None,
                   help="analysis results folder (default STORE/analysis; run when missing)")
    p.add_argument("--faithfulness", default="faithfulness", metavar="NAME",
                   help="which recorded faithfulness result to show (default faithfulness)")
    p.add_argument("--epsilon", type=float, default=0.3,
                   help="sink-head threshold, when the analyses run (default 0.3)")
    p.add_argument("--bootstrap", type=int, default=200,
                   help="bootstrap resamples of the vertex CI, when the analyses run")
    p.add_argument("--seed", type=int, default=0, help="seed, when the analyses run")
    p.add_argument("--level", type=float, default=0.05, help="test/FDR level (default 0.05)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.reports import build_report

    if args.bootstrap < 0:
        raise ValueError(f"--bootstrap must be >= 0 (got {args.bootstrap})")
    path = build_report(args.store, args.out, args.analysis, faithfulness=args.faithfulness,
                        progress=not args.no_progress, epsilon=args.epsilon,
                        n_boot=args.bootstrap, seed=args.seed, level=args.level)
    print(f"attngeom: wrote {path}")
    return 0
