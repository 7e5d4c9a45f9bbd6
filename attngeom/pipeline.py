"""The main job as a library: extract -> faithfulness -> analyze -> report, resumable.

``attngeom run`` is a thin layer over :func:`run_job`; a notebook calls it the same way::

    from attngeom.pipeline import job, run_job
    run_job(job(out="runs/demo", model="smollm2-135m", limit=16, faith_limit=4))

Output: ``OUT/store`` (the store, with its faithfulness result), ``OUT/store/analysis`` and
``OUT/report.pdf``. A step runs only when :func:`stale` says so (one rule for every step): an
output is missing, older than one of its inputs, or made with other settings. The store and
the faithfulness run resume from their own checkpoints when they do run.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from attngeom.common.options.commands import RUN_FAITH_BLOCK, RUN_STAGES, RunOptions
from attngeom.common.options.stages import (AnalysisOptions, ExtractConfig, FaithConfig,
                                            mismatches, provenance)

STORE, REPORT = "store", "report.pdf"           # OUT/store, OUT/report.pdf


@dataclass
class Job:
    """The main job's options: its own and each stage's (``faith`` None: skipped)."""

    run: RunOptions
    extract: ExtractConfig
    faith: FaithConfig | None
    analysis: AnalysisOptions

    def check(self) -> None:
        """ValueError naming the first bad option (before torch is imported)."""
        self.extract.check()
        self.run.check(self.extract)
        if self.faith is not None:
            self.faith.check()
        self.analysis.check()


def job(**options) -> Job:
    """Make the main job's options from keyword options of ``attngeom run``.

    Parameters
    ----------
    **options
        Options of ``attngeom run`` by their Python names (``out``, ``model``, ``limit``,
        ``faith_limit``, ``metrics``, ``n_boot``, ...); each one not given takes its default. An
        option it does not take is a TypeError, as for any Python function.

    Returns
    -------
    Job
        The run's own options and each stage's.
    """
    known = {f.name for f in fields(RunOptions)} | {n for _, only, _ in RUN_STAGES for n in only}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"job() got unexpected options {', '.join(unknown)}; it takes "
                        f"{', '.join(sorted(known))}")
    stages = {cls: {**defaults, **{k: v for k, v in options.items() if k in exposed}}
              for cls, exposed, defaults in RUN_STAGES}       # as `attngeom run` takes them
    own = RunOptions(**{k: v for k, v in options.items()
                        if k in {f.name for f in fields(RunOptions)}})
    faith = (FaithConfig(**stages[FaithConfig], limit=own.faith_limit,
                         block_size=RUN_FAITH_BLOCK) if own.faith_limit else None)
    made = Job(own, ExtractConfig(**stages[ExtractConfig]), faith,
               AnalysisOptions(**stages[AnalysisOptions]))
    made.check()
    return made


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


# ----------------------------------------------------------------------------- staleness
def stale(outputs: list[Path], inputs: list[Path], same_settings: bool) -> str | None:
    """Why a step must run (None: its outputs are current): an output is missing, older than
    one of its inputs, or was made with other settings."""
    if not outputs or not all(p.is_file() for p in outputs):
        return "missing"
    if not same_settings:
        return "made with other settings"
    newest_input = max((p.stat().st_mtime for p in inputs if p.is_file()), default=0.0)
    if min(p.stat().st_mtime for p in outputs) < newest_input:
        return "older than its inputs"
    return None


def _manifest(store: Path) -> dict | None:
    from attngeom.common.errors import StoreError
    from attngeom.store import read_manifest
    from attngeom.store.format.manifest import MANIFEST

    try:
        return read_manifest(store) if (store / MANIFEST).is_file() else None
    except StoreError:
        return None


def _store_settings(store: Path, job: Job) -> bool:
    """The store is complete and was made from this model and data with these options."""
    from attngeom.store.io.results import is_faith_only

    m = _manifest(store)
    return bool(m and m["complete"] and not is_faith_only(m)
                and m.get("sources") == {"model": job.run.model, "data": job.run.data}
                and not mismatches(job.extract, m["config"]))


def _faith_settings(store: Path, job: Job) -> bool:
    """The store records a faithfulness result of this data with these options."""
    from attngeom.store.format.manifest import spec_label     # the data as the result records it
    from attngeom.store.io.results import entries

    entry = entries(_manifest(store) or {}).get(job.faith.name)
    return bool(entry and entry["config"]["data"].get("spec") == spec_label(job.run.data)
                and not mismatches(job.faith, entry["config"]))


def _analysis_settings(store: Path, job: Job) -> bool:
    """The analyses were made from this store with these options (their provenance)."""
    import xarray as xr

    from attngeom.analysis.results import ANALYSIS_DIR, RESULT_FILES

    path = store / ANALYSIS_DIR / RESULT_FILES["sinks"]
    m = _manifest(store)
    if not path.is_file() or not m:
        return False
    with xr.open_dataset(path, engine="h5netcdf") as f:
        attrs = dict(f.attrs)
    asked = provenance(job.analysis)
    return attrs.get("config_hash") == m["config_hash"] and all(
        value is None or str(attrs.get(f"analysis_{name}")) == str(value)
        for name, value in asked.items())


# ----------------------------------------------------------------------------- steps
def _outputs(store: Path, out: Path, job: Job) -> dict[str, list[Path]]:
    from attngeom.analysis.results import ANALYSIS_DIR, RESULT_FILES, SUMMARY_FILE
    from attngeom.store.format.manifest import MANIFEST

    faith = [store / f"{job.faith.name}.nc"] if job.faith is not None else []
    analysis = [store / ANALYSIS_DIR / f for f in (*RESULT_FILES.values(), SUMMARY_FILE)]
    return {"extract": [store / MANIFEST], "faithfulness": faith, "analyze": analysis,
            "report": [out / REPORT], "shards": sorted((store / "shards").glob("*.nc"))}


def _extract(store: Path, job: Job) -> None:
    from attngeom.extract.run import extract  # torch: only here

    extract(job.run.model, job.run.data, store, job.extract,
            trust_remote_code=job.run.trust_remote_code, progress=not job.run.quiet)


def _faithfulness(store: Path, job: Job) -> None:
    from attngeom.extract.faithfulness.experiment import faithfulness  # torch: only here
    from attngeom.store.io.results import entries

    recorded = job.faith.name in entries(_manifest(store) or {})
    faithfulness(job.run.model, job.run.data, store, job.faith,
                 trust_remote_code=job.run.trust_remote_code, progress=not job.run.quiet,
                 force=recorded)                   # replace a result of other options


def _analyze(store: Path, job: Job) -> None:
    from attngeom.analysis import run_all
    from attngeom.analysis.results import ANALYSIS_DIR
    from attngeom.store import open_store

    run_all(open_store(store), store / ANALYSIS_DIR, job.analysis, progress=not job.run.quiet)


def _report(store: Path, out: Path, job: Job) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.analysis.results import ANALYSIS_DIR
    from attngeom.reports.documents.load import gather
    from attngeom.reports.documents.report import render

    render(gather(store, store / ANALYSIS_DIR, progress=not job.run.quiet,
                  options=job.analysis), out / REPORT)


def steps(job: Job) -> list[tuple[str, Callable[[], str | None], Callable[[], None]]]:
    """(name, why it must run or None, run it) of each step, in order."""
    out = Path(job.run.out)
    store = out / STORE
    o = lambda: _outputs(store, out, job)                                   # noqa: E731
    return [
        ("extract", lambda: stale(o()["extract"], [], _store_settings(store, job)),
         lambda: _extract(store, job)),
        ("faithfulness", lambda: None if job.faith is None else stale(
            o()["faithfulness"], [], _faith_settings(store, job)),
         lambda: _faithfulness(store, job)),
        ("analyze", lambda: stale(o()["analyze"], o()["shards"],
                                  _analysis_settings(store, job)),
         lambda: _analyze(store, job)),
        ("report", lambda: stale(o()["report"], o()["analyze"] + o()["faithfulness"], True),
         lambda: _report(store, out, job)),
    ]


def run_job(job: Job, log: Callable[[str], None] = print) -> Path:
    """Run the steps whose outputs are stale (:func:`stale`).

    Parameters
    ----------
    job : Job
        The options, from :func:`job`.
    log : callable
        Receives one line per step (default: print).

    Returns
    -------
    Path
        The report's path.
    """
    job.run.threads = limit_threads(job.run.threads)
    out = Path(job.run.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    todo = steps(job)
    for i, (name, why, step) in enumerate(todo, 1):
        reason = why()
        skipped = (job.faith is None and name == "faithfulness")
        log(f"attngeom run [{i}/{len(todo)}] {name} ...")
        t0 = time.perf_counter()
        if reason is not None:
            step()
        status = ("skipped (--faith-limit 0)" if skipped else "up to date" if reason is None
                  else f"done ({reason})")
        log(f"attngeom run [{i}/{len(todo)}] {name}: {status} ({time.perf_counter() - t0:.0f} s)")
    log(f"attngeom run: finished in {time.perf_counter() - start:.0f} s")
    log(f"attngeom run: report at {out / REPORT}")
    return out / REPORT
