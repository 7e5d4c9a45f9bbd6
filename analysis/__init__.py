"""CPU statistics on an opened attngeom store, one module per question.

Each function takes an ``xarray.Dataset`` (dense or compact store, see
:mod:`attngeom.store.schema`) and returns an ``xarray.Dataset`` of labeled results with stable
names (listed in each module's docstring). Reductions stream one layer and a bounded block of
sequences at a time. :func:`run_all` runs all four in a single pass and writes
``sinks.nc``, ``convexity.nc``, ``anti_alignment.nc``, ``decomposition.nc`` and ``summary.csv``.
"""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr

from attngeom.store import schema as S
from attngeom.store.vocab import EPSILON, LEVEL, N_BOOT, SEED

from ._common import with_provenance
from .anti_alignment import AntiAlignmentAccumulator, anti_alignment
from .blocks import DEFAULT_BLOCK_ELEMENTS, describe, require, run_pass
from .convexity import ConvexityAccumulator, convexity
from .decomposition import DecompositionAccumulator, decomposition, elementwise_groups
from .sinks import SinkAccumulator, sinks
from .summary import summary_table

__all__ = ["sinks", "convexity", "anti_alignment", "decomposition", "summary_table", "run_all",
           "RESULT_FILES"]

RESULT_FILES = {"sinks": "sinks.nc", "convexity": "convexity.nc",
                "anti_alignment": "anti_alignment.nc", "decomposition": "decomposition.nc"}
SUMMARY_FILE = "summary.csv"
NEEDED = [S.ALPHA, S.COSINE, S.VALUE_NORM, S.OUTPUT_NORM, S.SINK_VALUE_COSINE,
          S.RESIDUAL_NORM, S.SINK_RESIDUAL_COSINE]


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    write(tmp)
    os.replace(tmp, path)


def run_all(ds: xr.Dataset, out_dir: str | os.PathLike | None = None, *,
            sink_k: int | None = None, tail_w: int | None = None,
            epsilon: float = EPSILON, n_boot: int = N_BOOT, seed: int = SEED,
            level: float = LEVEL, layers=None, mixed: bool = True, progress: bool = True,
            block_elements: int = DEFAULT_BLOCK_ELEMENTS, scheduler: str | None = None) -> dict:
    """Run the four analyses in one pass over the store; write them when ``out_dir`` is given.

    ``scheduler``: None (dask's in-process scheduler), ``"local:N"`` (a dask.distributed
    ``LocalCluster`` of N worker processes, started and closed here) or ``"tcp://HOST:PORT"``
    (a running dask scheduler): the store is read and reduced there, with identical results.

    Returns
    -------
    dict with keys ``sinks``, ``convexity``, ``anti_alignment``, ``decomposition``
    (xarray.Dataset each, provenance in ``attrs``) and ``summary`` (pandas.DataFrame).
    """
    require(ds, NEEDED, "`attngeom analyze`")
    info = describe(ds, sink_k, tail_w, layers)
    ds.attngeom.groups(info.k, info.w).require_groups()
    analytic = info.store_k == 1
    accs = {"sinks": SinkAccumulator(info.heads, epsilon),
            "convexity": ConvexityAccumulator(info.heads, n_boot=n_boot, seed=seed,
                                              level=level, analytic=analytic),
            "anti_alignment": AntiAlignmentAccumulator(info.heads, level=level, mixed=mixed,
                                                        seed=seed),
            "decomposition": DecompositionAccumulator(elementwise_groups(ds))}
    from attngeom.store.distributed import scheduler as dask_scheduler

    with dask_scheduler(scheduler):
        run_pass(ds, info, list(accs.values()), elements=block_elements, progress=progress)
    params = dict(sink_k=info.k, tail_w=info.w, epsilon=epsilon, n_boot=n_boot, seed=seed,
                  level=level)
    results = {name: with_provenance(acc.result(), ds.attrs, **params)
               for name, acc in accs.items()}
    results["summary"] = summary_table(results["sinks"], results["convexity"],
                                       results["anti_alignment"], results["decomposition"])
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, filename in RESULT_FILES.items():
            _write_atomic(out / filename, results[name].to_netcdf)
        _write_atomic(out / SUMMARY_FILE, lambda p: results["summary"].to_csv(p, index=False))
    return results
