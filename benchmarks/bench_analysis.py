"""Analysis time against a plain read of the same store, and peak memory; one JSON object per line.

For each size in ``--sequences`` a synthetic compact store (``synthetic_store.py``: the real
schema, written by attngeom's own shard writer) is generated, or reused from ``--cache``. For
each thread count in ``--threads`` (``all`` = every core) two cases run, each in a fresh
subprocess (peak RSS by ``os.wait4``), alternating:

* ``plain_read``: every shard opened with plain xarray (h5netcdf) and every variable
  decompressed into memory, one shard at a time (the I/O floor);
* ``analyze``: ``attngeom.analysis.run_all(open_store(...), out)``.

The store's files are read once before the cases (``--no-warm-cache`` to skip), so that the
first case does not also time the disk.

Threads: BLAS/OpenMP threads (environment) and dask's workers (``synchronous`` at 1). At 1 the
whole analysis runs in one process; above 1 ``run_all`` uses what ``attngeom analyze`` uses by
default: dask's threads for the reads and ``threads - 1`` (at most 4) processes fitting each
layer's convexity models while the next layer is read (``fit_workers=None``). Peak RSS is the
largest single process (``wait4``); ``analyze`` also reports its own peak and its largest
child process's, whose sum bounds the total. The
target (issue 17): ``analyze`` within 3x ``plain_read`` at the same threads, at 200 and 2,000
sequences, and 2,000 sequences x 30 layers x 9 heads x 256 queries within 4 GiB.

    python benchmarks/bench_analysis.py --sequences 200 --threads 1,all      # ~6 min
    python benchmarks/bench_analysis.py --sequences 2000 --cache /big/disk   # the target size
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, json_lines, log, machine, run_child_rss  # noqa: E402

TARGET_GIB = 4.0


def _threads(threads: int) -> None:
    """Use ``threads`` workers in dask (synchronous at 1); BLAS threads come from the environment."""
    import dask

    if threads <= 1:
        dask.config.set(scheduler="synchronous")
    else:
        dask.config.set(scheduler="threads", num_workers=threads)


def plain_read(store: str, threads: int) -> int:
    """Open every shard with plain xarray and decompress every variable, one shard at a time
    (``Dataset.load``; with dask's threads over the file's chunks when ``threads`` > 1)."""
    import dask
    import xarray as xr

    total = 0
    for shard in sorted(Path(store, "shards").glob("*.nc")):
        with xr.open_dataset(shard, engine="h5netcdf",
                             chunks={} if threads > 1 else None) as ds:
            arrays = (dask.compute(*[ds[v].data for v in ds.data_vars]) if threads > 1
                      else [ds[v].values for v in ds.data_vars])
            total += sum(a.nbytes for a in arrays)
            del arrays
    return total


def _child(case: str, store: str, out: str, threads: int, trace: bool) -> None:
    """Internal: one case in this fresh process (optionally: where RSS peaks)."""
    t0 = time.perf_counter()
    _threads(threads)
    if case == "plain_read":
        nbytes = plain_read(store, threads)
        print(json.dumps({"read_s": time.perf_counter() - t0, "decompressed_bytes": nbytes}),
              flush=True)
        return
    from attngeom.analysis import run_all
    from attngeom.store.io.reader import open_store
    t1 = time.perf_counter()
    import resource

    from attngeom.analysis.blocks import default_fit_workers
    sampler = PeakSampler() if trace else None
    ds = open_store(store)
    run_all(ds, out, progress=False)
    t2 = time.perf_counter()
    kib = 1024 / 2**20
    rec = {"import_s": t1 - t0, "analysis_s": t2 - t1, "fit_workers": default_fit_workers(),
           "self_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
           "children_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib}
    if sampler:
        rec["rss_peak_at"] = sampler.stop()
    print(json.dumps(rec), flush=True)


def _env(threads: int) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


class PeakSampler:
    """Samples this process's RSS every 0.25 s and keeps the main thread's stack at the peak."""

    def __init__(self, period: float = 0.25):
        import threading

        from _common import rss_bytes
        self.main = threading.get_ident()
        self.best, self.stack, self.done = 0, [], False

        def loop():
            import traceback
            while not self.done:
                rss = rss_bytes()
                if rss > self.best:
                    frame = sys._current_frames().get(self.main)
                    self.best = rss
                    self.stack = [f"{f.filename.rsplit('/', 2)[-2:][-1]}:{f.lineno} {f.name}"
                                  for f in traceback.extract_stack(frame)][-12:]
                time.sleep(period)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def stop(self) -> dict:
        self.done = True
        self.thread.join()
        return {"rss_mib": self.best / 2**20, "stack": self.stack}


def available() -> str | None:
    """None when run_all can be used, else why not."""
    try:
        from attngeom.analysis import run_all  # noqa: F401
    except ImportError as exc:
        return f"attngeom.analysis.run_all is not available yet ({exc})"
    return None


def warm_page_cache(store: Path) -> float:
    """Read every file of the store once, so that both cases find it in the page cache (the
    first case would otherwise also time the disk); seconds taken."""
    t0 = time.perf_counter()
    for f in sorted(store.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    return time.perf_counter() - t0


def _ratio(a, b):
    return a / b if a and b else None


def _run(case: str, store: Path, threads: int, a) -> dict:
    """One case in a fresh subprocess: its JSON record, wall/CPU seconds and peak RSS."""
    out = Path(tempfile.mkdtemp(prefix="attngeom-bench-out-"))
    log(f"analysis: {case} on {store.name}, {threads} thread(s)")
    res = run_child_rss([sys.executable, __file__, "--child", case, str(store), str(out),
                         str(threads)] + (["--trace-peak"] if a.trace_peak else []),
                        env=_env(threads), rss_limit_mib=a.rss_limit_gib * 1024)
    shutil.rmtree(out, ignore_errors=True)
    rec = {**(json_lines(res["stdout"]) or [{}])[-1], "rc": res["rc"], "wall_s": res["wall_s"],
           "cpu_s": res["cpu_s"], "peak_rss_mib": res["peak_rss_mib"],
           "killed_over_rss_limit": res["killed_over_rss_limit"]}
    if res["rc"] != 0:
        rec["error"] = res["stderr"].strip().splitlines()[-1:]
        emit({"bench": "analysis", "case": case, "threads": threads, **rec})
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", default="200",
                   help="comma-separated store sizes in sequences (target: 2000)")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--cache", default=None,
                   help="keep generated stores here and reuse them (default: temporary)")
    p.add_argument("--rss-limit-gib", type=float, default=8.0,
                   help="stop the analysis child above this RSS (protects a shared machine)")
    p.add_argument("--trace-peak", action="store_true",
                   help="also report the call stack where the RSS peaked (sampled)")
    p.add_argument("--threads", default="1,all",
                   help="comma-separated thread counts (all: every core)")
    p.add_argument("--no-warm-cache", dest="warm_cache", action="store_false",
                   help="do not read the store's files once before the cases")
    p.add_argument("--child", nargs=4, metavar=("CASE", "STORE", "OUT", "THREADS"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        case, store, out, threads = a.child
        _child(case, store, out, int(threads), a.trace_peak)
        return 0
    emit({"bench": "analysis", "section": "machine", **machine()})
    why = available()
    if why:
        emit({"bench": "analysis", "skipped": why})
        return 0
    from synthetic_store import generate

    threads = [os.cpu_count() if t == "all" else int(t) for t in a.threads.split(",") if t]
    root = Path(a.cache) if a.cache else Path(tempfile.mkdtemp(prefix="attngeom-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        for n in [int(x) for x in a.sequences.split(",") if x]:
            store = root / f"synthetic-{n}x{a.layers}x{a.heads}x{a.length}"
            if (store / "manifest.json").is_file() and '"complete": true' in (
                    store / "manifest.json").read_text():
                gen = {"reused": True}
            else:
                shutil.rmtree(store, ignore_errors=True)
                log(f"analysis: generating {store.name}")
                gen = generate(store, n, a.layers, a.heads, a.length)
            nbytes = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
            warm_s = warm_page_cache(store) if a.warm_cache else None
            for t in threads:
                recs = {case: _run(case, store, t, a) for case in ("plain_read", "analyze")}
                read, run = recs["plain_read"], recs["analyze"]
                emit({"bench": "analysis", "case": "analyze_vs_plain_read", "sequences": n,
                      "layers": a.layers, "heads": a.heads, "queries": a.length,
                      "store_bytes": nbytes, "threads": t,
                      "plain_read_s": read.get("read_s"), "analyze_s": run.get("analysis_s"),
                      "ratio": _ratio(run.get("analysis_s"), read.get("read_s")),
                      "target_ratio": 3.0,
                      "plain_read_peak_rss_mib": read["peak_rss_mib"],
                      "analyze_peak_rss_mib": run["peak_rss_mib"],
                      "analyze_fit_workers": run.get("fit_workers"),
                      "analyze_self_peak_rss_mib": run.get("self_peak_rss_mib"),
                      "analyze_children_peak_rss_mib": run.get("children_peak_rss_mib"),
                      "plain_read_cpu_s": read.get("cpu_s"), "analyze_cpu_s": run.get("cpu_s"),
                      "target_rss_gib": TARGET_GIB if n >= 2000 else None,
                      "load_avg_1m": os.getloadavg()[0], "page_cache_warm_s": warm_s,
                      "generate": {k: v for k, v in gen.items() if k != "store"}})
    finally:
        if not a.cache:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
