"""``attngeom analyze STORE --out DIR``: sinks, convexity, anti-alignment and decomposition.

Writes ``sinks.nc``, ``convexity.nc``, ``anti_alignment.nc``, ``decomposition.nc`` and
``summary.csv`` into DIR (see :mod:`attngeom.analysis` for the variable names). With
``--scheduler local:N`` (a dask ``LocalCluster``) or ``--scheduler tcp://HOST:PORT`` (a running
dask scheduler) the store's reads and reductions run on that cluster; the results are identical.
"""

from __future__ import annotations

import argparse


def _layers(text: str) -> list[int]:
    """``"0,2,5-7"`` -> [0, 2, 5, 6, 7]."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layers takes layer numbers and ranges like 0,2,5-7 (got {text!r})") from None
    return out


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="store directory or file written by `attngeom extract`")
    p.add_argument("--out", required=True, help="output directory for the .nc files and CSV")
    p.add_argument("--sink-k", type=int, default=None,
                   help="sink keys k (default: the store's; a compact store needs its own)")
    p.add_argument("--tail-w", type=int, default=None,
                   help="tail window w of the decomposition (default: the store's, else 8)")
    p.add_argument("--epsilon", type=float, default=0.3,
                   help="sink-head threshold on the mean sink rate (Gu et al.; default 0.3)")
    p.add_argument("--bootstrap", type=int, default=200,
                   help="sequence-cluster bootstrap resamples for the vertex CI (0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and subsamples")
    p.add_argument("--layers", type=_layers, default=None,
                   help="layers to analyse, e.g. 0,2,5-7 (default: all)")
    p.add_argument("--level", type=float, default=0.05, help="test/FDR level (default 0.05)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--scheduler", default=None,
                   help="dask.distributed cluster: local:N (N worker processes) or "
                        "tcp://HOST:PORT (a running `dask scheduler`); default: in-process")


def run(args: argparse.Namespace) -> int:
    from attngeom.analysis import run_all
    from attngeom.store import open as open_store
    from attngeom.store.distributed import parse_scheduler

    if args.scheduler is not None:
        parse_scheduler(args.scheduler)            # a bad spec fails before the store is read
    ds = open_store(args.store)
    if ds.sizes.get("sequence", 0) == 0:
        raise ValueError(f"store {args.store} has no sequences; run `attngeom extract` first")
    if args.bootstrap < 0:
        raise ValueError(f"--bootstrap must be >= 0 (got {args.bootstrap})")
    results = run_all(ds, args.out, sink_k=args.sink_k, tail_w=args.tail_w,
                      epsilon=args.epsilon, n_boot=args.bootstrap, seed=args.seed,
                      level=args.level, layers=args.layers, progress=not args.no_progress,
                      scheduler=args.scheduler)
    verdict = results["decomposition"].attrs.get("verdict", "")
    print(f"attngeom: wrote sinks.nc, convexity.nc, anti_alignment.nc, decomposition.nc and "
          f"summary.csv to {args.out}")
    if verdict:
        print(f"attngeom: {verdict}")
    return 0
