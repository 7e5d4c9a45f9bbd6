"""``attngeom run``: the main job, extract -> faithfulness -> analyze -> report, in one command.

The defaults finish in about five minutes on two shared CPU cores (one thread): SmolLM2-135M
over the first 48 chunks of the built-in corpus at 128 tokens (compact store), faithfulness on
8 of them for the paper's four metrics (signed and magnitude ranking, removal fractions 0.1, 0.25
and 0.5), the four analyses, and the PDF. Output:
``OUT/store`` (the store, with ``faithfulness.nc``), ``OUT/store/analysis`` and
``OUT/report.pdf``. Rerunning skips finished steps: the store and the faithfulness run resume
from their checkpoints, the analyses rerun only when older than the store, the report only when
older than its inputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attngeom.common.options.commands import RUN_FAITH_BLOCK, RUN_STAGES, RunOptions
from attngeom.common.options.stages import (AnalysisOptions, ExtractConfig, FaithConfig,
                                            add_arguments, from_args, mismatches)

STORE, ANALYSIS, REPORT = "store", "analysis", "report.pdf"


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, RunOptions)
    for stage, only, defaults in RUN_STAGES:
        add_arguments(p, stage, only, defaults)


@dataclass
class Job:
    """The main job's options: its own and each stage's (``faith`` None: skipped)."""

    run: RunOptions
    extract: ExtractConfig
    faith: FaithConfig | None
    analysis: AnalysisOptions


def job_options(args: argparse.Namespace) -> Job:
    """The stages' options from the command line, each checked (before torch is imported)."""
    own, extract = from_args(args, RunOptions), from_args(args, ExtractConfig)
    extract.check()
    own.check(extract)
    faith = None
    if own.faith_limit:
        faith = from_args(args, FaithConfig, limit=own.faith_limit, block_size=RUN_FAITH_BLOCK)
        faith.check()
    analysis = from_args(args, AnalysisOptions)
    analysis.check()
    return Job(own, extract, faith, analysis)


def limit_threads(n: int | None) -> int:
    """Set the thread count of BLAS and torch before they load (default: the environment's
    ``OMP_NUM_THREADS``, else 1)."""
    if n is None:
        n = int(os.environ.get("OMP_NUM_THREADS") or 1)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return n


def _manifest(store: Path) -> dict | None:
    from attngeom.store import read_manifest
    from attngeom.common.errors import StoreError

    try:
        return read_manifest(store) if (store / "manifest.json").is_file() else None
    except StoreError:
        return None


def store_done(store: Path, job: Job) -> bool:
    """The store is complete and was made from this model and data with these options."""
    from attngeom.store.io.results import is_faith_only

    m = _manifest(store)
    if not m or not m["complete"] or is_faith_only(m):
        return False
    return (m.get("sources") == {"model": job.run.model, "data": job.run.data}
            and not mismatches(job.extract, m["config"]))


def faith_done(store: Path, job: Job) -> bool:
    """The store records a faithfulness result of this data with these options."""
    from attngeom.store.io.results import entries

    entry = entries(_manifest(store) or {}).get(job.faith.name)
    if not entry or not (store / entry["file"]).is_file():
        return False
    from attngeom.store.format.manifest import spec_label     # the data as the result records it

    return (entry["config"]["data"].get("spec") == spec_label(job.run.data)
            and not mismatches(job.faith, entry["config"]))


# ----------------------------------------------------------------------------- steps
def step_extract(store: Path, job: Job) -> str:
    if store_done(store, job):
        return "already complete"
    from attngeom.extract.run import extract  # torch: only here

    limit_threads(job.run.threads)
    extract(job.run.model, job.run.data, store, job.extract,
            trust_remote_code=job.run.trust_remote_code, progress=not job.run.quiet)
    return "done"


def step_faithfulness(store: Path, job: Job) -> str:
    if job.faith is None:
        return "skipped (--faith-limit 0)"
    if faith_done(store, job):
        return "already complete"
    from attngeom.extract.faithfulness.experiment import faithfulness  # torch: only here

    from attngeom.store.io.results import entries

    limit_threads(job.run.threads)
    recorded = job.faith.name in entries(_manifest(store) or {})
    faithfulness(job.run.model, job.run.data, store, job.faith,
                 trust_remote_code=job.run.trust_remote_code, progress=not job.run.quiet,
                 force=recorded)                   # replace a result of other options
    return "done"


def step_analyze(store: Path, job: Job) -> str:
    from attngeom.analysis import run_all
    from attngeom.analysis.results import analysis_state
    from attngeom.store import open_store, read_manifest

    directory = store / ANALYSIS
    state = analysis_state(store, read_manifest(store), directory)
    if state == "current":
        return "up to date"
    run_all(open_store(store), directory, job.analysis, progress=not job.run.quiet)
    return "done"


def step_report(store: Path, out: Path, job: Job) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.reports.documents.load import gather
    from attngeom.reports.documents.report import render

    inputs = [p for p in (store / ANALYSIS).glob("*") if p.is_file()]
    inputs += [store / "faithfulness.nc"] if (store / "faithfulness.nc").is_file() else []
    if out.is_file() and inputs and out.stat().st_mtime > max(p.stat().st_mtime for p in inputs):
        return "up to date"
    render(gather(store, store / ANALYSIS, progress=not job.run.quiet, options=job.analysis),
           out)
    return "done"


def run(args: argparse.Namespace) -> int:
    job = job_options(args)
    job.run.threads = limit_threads(job.run.threads)
    out = Path(job.run.out)
    store = out / STORE
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    steps = [("extract", lambda: step_extract(store, job)),
             ("faithfulness", lambda: step_faithfulness(store, job)),
             ("analyze", lambda: step_analyze(store, job)),
             ("report", lambda: step_report(store, out / REPORT, job))]
    for i, (name, step) in enumerate(steps, 1):
        print(f"attngeom run [{i}/{len(steps)}] {name} ...", flush=True)
        t0 = time.perf_counter()
        status = step()
        print(f"attngeom run [{i}/{len(steps)}] {name}: {status} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"attngeom run: finished in {time.perf_counter() - start:.0f} s")
    print(f"attngeom run: report at {out / REPORT}")
    return 0
