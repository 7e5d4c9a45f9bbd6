"""CPU statistics on an opened attngeom store, one module per question.

Each function takes an ``xarray.Dataset`` (dense or compact store, see
:mod:`attngeom.store.format.schema`) and returns an ``xarray.Dataset`` of labeled results with
stable names (listed in each module's docstring). Reductions stream one layer and a bounded block of
sequences at a time. :func:`run_all` runs all four in a single pass and writes
``sinks.nc``, ``convexity.nc``, ``anti_alignment.nc``, ``decomposition.nc`` and ``summary.csv``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import xarray as xr

from attngeom.store.format import schema as S
from attngeom.common.options.stages import AnalysisOptions, provenance
from attngeom.common.options.ranges import parse_ranges
from attngeom.common.atomic import atomic_write_bytes
from attngeom.store.io.writer import write_netcdf

from ._common import shared_docs, with_provenance
from .anti_alignment import AntiAlignmentAccumulator, anti_alignment
from .blocks import (DEFAULT_BLOCK_ELEMENTS, default_fit_workers, describe, fit_pool,
                     require, run_pass)
from .convexity import ConvexityAccumulator, convexity
from .decomposition import DecompositionAccumulator, decomposition, elementwise_groups
from .sinks import SinkAccumulator, add_learned_sinks, sinks
from .results import ANALYSIS_DIR, RESULT_FILES, SUMMARY_FILE
from .summary import summary_table

__all__ = ["sinks", "convexity", "anti_alignment", "decomposition", "summary_table", "run_all",
           "RESULT_FILES"]

NEEDED = [S.ALPHA, S.COSINE, S.VALUE_NORM, S.OUTPUT_NORM, S.SINK_VALUE_COSINE,
          S.RESIDUAL_NORM, S.SINK_RESIDUAL_COSINE]


@shared_docs
def run_all(ds: xr.Dataset, out_dir: str | os.PathLike | None = None,
            options: AnalysisOptions | None = None, *, mixed: bool = True,
            progress: bool = True, block_elements: int = DEFAULT_BLOCK_ELEMENTS,
            scheduler: str | None = None, fit_workers: int | None = None,
            **changes) -> dict:
    """Run the four analyses in one pass over the store; write them when ``out_dir`` is given.

    Parameters
    ----------
    {ds}
    out_dir : str or os.PathLike, optional
        Where to write the results (one netCDF file per analysis and ``summary.csv``).
    options : AnalysisOptions, optional
        The analyses' options (:class:`attngeom.common.options.stages.AnalysisOptions`: sink_k,
        tail_w, epsilon, n_boot, seed, level, layers); default all defaults.
    mixed : bool
        Also fit the anti-alignment's per-layer MixedLM robustness check.
    {progress, block_elements}
    scheduler : str, optional
        None (dask's in-process scheduler), ``"local:N"`` (a dask.distributed ``LocalCluster``
        of N worker processes, started and closed here) or ``"tcp://HOST:PORT"`` (a running dask
        scheduler): the store is read and reduced there, with identical results.
    fit_workers : int, optional
        Processes that fit each layer's convexity models (OLS, bootstrap, LOWESS) while the
        next layer is read; None follows dask (0 under the synchronous scheduler, else one fewer
        than dask's workers, at most 4: :func:`attngeom.analysis.blocks.fit_pool`); the results
        are identical.
    **changes
        Changes to any field of ``options`` by keyword (``run_all(ds, out, n_boot=20)``).

    Returns
    -------
    dict
        Keys ``sinks``, ``convexity``, ``anti_alignment``, ``decomposition`` (an xarray.Dataset
        each, provenance in ``attrs``) and ``summary`` (a pandas.DataFrame).
    """
    opts = dataclasses.replace(options or AnalysisOptions(), **changes)
    opts.check()
    require(ds, NEEDED, "`attngeom analyze`")
    layers = parse_ranges(opts.layers, ds[S.LAYER].values, "--layers", "the store")
    info = describe(ds, opts.sink_k, opts.tail_w, layers)
    ds.attngeom.groups(info.k, info.w).require_groups()
    analytic = info.store_k == 1
    from .scheduler import scheduler as dask_scheduler

    workers = default_fit_workers() if fit_workers is None else int(fit_workers)
    with dask_scheduler(scheduler), fit_pool(workers) as pool:
        accs = {"sinks": SinkAccumulator(info.heads, opts.epsilon),
                "convexity": ConvexityAccumulator(
                    info.heads, n_boot=opts.n_boot, seed=opts.seed, level=opts.level,
                    analytic=analytic, executor=pool, max_pending=workers),
                "anti_alignment": AntiAlignmentAccumulator(info.heads, level=opts.level,
                                                            mixed=mixed, seed=opts.seed),
                "decomposition": DecompositionAccumulator(elementwise_groups(ds))}
        run_pass(ds, info, list(accs.values()), elements=block_elements, progress=progress)
        results = {name: acc.result() for name, acc in accs.items()}
    params = provenance(opts, sink_k=info.k, tail_w=info.w)
    results = {name: with_provenance(res, ds.attrs, **params) for name, res in results.items()}
    results["sinks"] = add_learned_sinks(results["sinks"], ds, info.k)
    results["summary"] = summary_table(results["sinks"], results["convexity"],
                                       results["anti_alignment"], results["decomposition"])
    if out_dir is not None:
        # each file atomic and fsynced; summary.csv removed first and written last, so that a
        # folder whose writing was stopped part-way reads as incomplete, never as one result
        out = Path(out_dir)
        (out / SUMMARY_FILE).unlink(missing_ok=True)
        for name, filename in RESULT_FILES.items():
            write_netcdf(results[name], out / filename)
        atomic_write_bytes(out / SUMMARY_FILE, results["summary"].to_csv(index=False).encode())
    return results
