"""Analysis time and peak memory on synthetic compact stores; one JSON object per line.

For each size in ``--sequences`` a synthetic compact store (``synthetic_store.py``: the real
schema, written by attngeom's own shard writer) is generated, or reused from ``--cache``, and
``attngeom.analysis.run_all(open_store(...), out)`` runs in a fresh subprocess whose peak RSS
(``os.wait4``) and wall time are reported. Several sizes show how memory scales; the target is
2,000 sequences x 30 layers x 9 heads x 256 queries within 4 GiB.

    python benchmarks/bench_analysis.py --sequences 100,200        # quick scaling (~10 min)
    python benchmarks/bench_analysis.py --sequences 2000 --cache /big/disk   # the target size
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, json_lines, log, machine, run_child_rss  # noqa: E402

TARGET_GIB = 4.0


def _child(store: str, out: str, trace: bool) -> None:
    """Internal: open the store and run every analysis once (optionally: where RSS peaks)."""
    t0 = time.perf_counter()
    from attngeom.analysis import run_all
    from attngeom.store.reader import open_store
    t1 = time.perf_counter()
    sampler = PeakSampler() if trace else None
    ds = open_store(store)
    run_all(ds, out, progress=False)
    t2 = time.perf_counter()
    rec = {"import_s": t1 - t0, "analysis_s": t2 - t1}
    if sampler:
        rec["rss_peak_at"] = sampler.stop()
    print(json.dumps(rec), flush=True)


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
    p.add_argument("--child", nargs=2, metavar=("STORE", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(*a.child, a.trace_peak)
        return 0
    emit({"bench": "analysis", "section": "machine", **machine()})
    why = available()
    if why:
        emit({"bench": "analysis", "skipped": why})
        return 0
    from synthetic_store import generate

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
            out = Path(tempfile.mkdtemp(prefix="attngeom-bench-out-"))
            log(f"analysis: run_all on {store.name}")
            res = run_child_rss([sys.executable, __file__, "--child", str(store), str(out)]
                                + (["--trace-peak"] if a.trace_peak else []),
                                rss_limit_mib=a.rss_limit_gib * 1024)
            shutil.rmtree(out, ignore_errors=True)
            inner = (json_lines(res["stdout"]) or [{}])[-1]
            cells = n * a.layers * a.heads * a.length
            rec = {"bench": "analysis", "case": "run_all", "sequences": n, "layers": a.layers,
                   "heads": a.heads, "queries": a.length, "store_bytes": nbytes,
                   "rc": res["rc"], "wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
                   "killed_over_rss_limit": res["killed_over_rss_limit"],
                   "peak_rss_mib": res["peak_rss_mib"], **inner,
                   "ns_per_cell": 1e9 * inner.get("analysis_s", float("nan")) / cells,
                   "target": f"2000 sequences within {TARGET_GIB} GiB",
                   "generate": {k: v for k, v in gen.items() if k != "store"}}
            if res["rc"] != 0:
                rec["error"] = res["stderr"].strip().splitlines()[-1:]
            emit(rec)
    finally:
        if not a.cache:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
