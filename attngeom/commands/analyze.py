"""``attngeom analyze STORE --out DIR``: sinks, convexity, anti-alignment and decomposition.

Writes ``sinks.nc``, ``convexity.nc``, ``anti_alignment.nc``, ``decomposition.nc`` and
``summary.csv`` into DIR (see :mod:`attngeom.analysis` for the variable names), and for every
faithfulness result the store records its statistics, ``<name>_stats.nc``
(:mod:`attngeom.analysis.faithfulness_stats`; recomputed only when missing or stale). With
``--scheduler local:N`` (a dask ``LocalCluster``) or ``--scheduler tcp://HOST:PORT`` (a running
dask scheduler) the store's reads and reductions run on that cluster; the results are identical.
"""

from __future__ import annotations

import argparse

from attngeom.common.options.commands import AnalyzeCommand
from attngeom.common.options.stages import AnalysisOptions, add_arguments, from_args
from attngeom.common.errors import Refusal


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, AnalyzeCommand)
    add_arguments(p, AnalysisOptions)


def run(args: argparse.Namespace) -> int:
    from attngeom.analysis import run_all
    from attngeom.analysis.faithfulness_stats import for_store, stats_settings
    from attngeom.store import open as open_store
    from attngeom.store import StoreError, read_manifest
    from attngeom.analysis.scheduler import parse_scheduler
    from attngeom.store.io.results import entries, is_faith_only

    cmd, options = from_args(args, AnalyzeCommand), from_args(args, AnalysisOptions)
    options.check()
    if cmd.scheduler is not None:
        parse_scheduler(cmd.scheduler)             # a bad spec fails before the store is read
    try:
        manifest = read_manifest(cmd.store)
    except StoreError:
        manifest = None                        # open_store below says what is wrong
    for name in entries(manifest) if manifest else ():
        stats, _, why = for_store(cmd.store, name, cmd.out, stats_settings(options),
                                  manifest=manifest)
        print(f"attngeom: {name}: " + (f"not analysed ({name}.nc: {why})" if stats is None
                                       else f"statistics in {cmd.out}/{name}_stats.nc"))
    if manifest and is_faith_only(manifest):
        return 0
    ds = open_store(cmd.store)
    if ds.sizes.get("sequence", 0) == 0:
        raise Refusal(f"store {cmd.store} has no sequences; run `attngeom extract` first")
    results = run_all(ds, cmd.out, options, progress=not cmd.quiet,
                      scheduler=cmd.scheduler)
    verdict = results["decomposition"].attrs.get("verdict", "")
    print(f"attngeom: wrote sinks.nc, convexity.nc, anti_alignment.nc, decomposition.nc and "
          f"summary.csv to {cmd.out}")
    if verdict:
        print(f"attngeom: {verdict}")
    return 0
