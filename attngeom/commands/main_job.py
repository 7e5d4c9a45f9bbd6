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
import json
import os
import sys
import time
from pathlib import Path

STORE, ANALYSIS, REPORT = "store", "analysis", "report.pdf"
FAITH_METRICS = "attention,value_weighted,value_weighted_normalized,contribution"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--model", default="smollm2-135m",
                   help="hub id, model directory, .gguf file or built-in name")
    p.add_argument("--data", default="builtin", help="texts: .jsonl/.parquet/.txt, hf:..., builtin")
    p.add_argument("--limit", type=int, default=48, help="texts to extract (default 48)")
    p.add_argument("--max-length", type=int, default=128, help="tokens per text (default 128)")
    p.add_argument("--mode", choices=["compact", "dense"], default="compact")
    p.add_argument("--text-field", default=None, help="field of JSONL/Parquet records")
    p.add_argument("--faith-limit", type=int, default=8,
                   help="texts for the faithfulness experiment (default 8; 0 skips it)")
    p.add_argument("--metrics", default=FAITH_METRICS, help="faithfulness metrics")
    p.add_argument("--ranks", default="signed,magnitude", help="signed, magnitude or both")
    p.add_argument("--fractions", default="0.1,0.25,0.5",
                   help="removal fractions (default 0.1,0.25,0.5)")
    p.add_argument("--bootstrap", type=int, default=200, help="vertex CI bootstrap resamples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of torch and BLAS (default: $OMP_NUM_THREADS, else 1; on a "
                        "shared machine more threads wait on each other and run slower)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


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


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _manifest(store: Path) -> dict | None:
    try:
        return json.loads((store / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def store_done(store: Path, args) -> bool:
    """The store is complete and was made by this command with these options."""
    m = _manifest(store)
    if not m or not m.get("complete") or m.get("kind") == "faithfulness":
        return False
    opts, data = m["config"]["options"], m["config"]["data"]
    return (m.get("sources") == {"model": str(args.model), "data": str(args.data)}
            and data.get("limit") == args.limit and data.get("text_field") == args.text_field
            and opts.get("mode") == args.mode and opts.get("max_length") == args.max_length)


def faith_options(args) -> dict:
    """The faithfulness options this command sets (compared with the recorded run)."""
    return {"metrics": list(_names(args.metrics)), "ranks": list(_names(args.ranks)),
            "fractions": [float(f) for f in _names(args.fractions)],
            "max_length": args.max_length, "limit": args.faith_limit, "task": "lm"}


def faith_done(store: Path, args) -> bool:
    entry = (_manifest(store) or {}).get("faithfulness", {}).get("faithfulness")
    if not entry or not (store / entry["file"]).is_file():
        return False
    recorded = entry["config"]["options"]
    from attngeom.store.manifest import spec_label     # the data as the result records it

    return (all(recorded.get(k) == v for k, v in faith_options(args).items())
            and entry["config"]["data"].get("spec") == spec_label(args.data))


# ----------------------------------------------------------------------------- steps
def step_extract(store: Path, args) -> str:
    if store_done(store, args):
        return "already complete"
    from attngeom.extract.run import ExtractConfig, extract  # torch: only here

    limit_threads(args.threads)
    cfg = ExtractConfig(mode=args.mode, max_length=args.max_length, limit=args.limit,
                        text_field=args.text_field, batch_size=args.batch_size,
                        device=args.device, dtype=args.dtype)
    extract(args.model, args.data, store, cfg, trust_remote_code=args.trust_remote_code,
            progress=not args.quiet)
    return "done"


def step_faithfulness(store: Path, args) -> str:
    if args.faith_limit == 0:
        return "skipped (--faith-limit 0)"
    if faith_done(store, args):
        return "already complete"
    from attngeom.extract.faithfulness import FaithConfig, faithfulness  # torch: only here

    limit_threads(args.threads)
    opts = faith_options(args)
    cfg = FaithConfig(metrics=tuple(opts["metrics"]), ranks=tuple(opts["ranks"]),
                      fractions=tuple(opts["fractions"]), max_length=args.max_length,
                      limit=args.faith_limit, text_field=args.text_field, block_size=4,
                      batch_size=args.batch_size, device=args.device, dtype=args.dtype)
    recorded = "faithfulness" in (_manifest(store) or {}).get("faithfulness", {})
    faithfulness(args.model, args.data, store, cfg, trust_remote_code=args.trust_remote_code,
                 progress=not args.quiet, force=recorded)  # replace a result of other options
    return "done"


def step_analyze(store: Path, args) -> str:
    from attngeom.analysis import run_all
    from attngeom.reports.load import analysis_state
    from attngeom.store import open_store, read_manifest

    directory = store / ANALYSIS
    state = analysis_state(store, read_manifest(store), directory)
    if state == "current":
        return "up to date"
    run_all(open_store(store), directory, n_boot=args.bootstrap, seed=args.seed,
            progress=not args.quiet)
    return "done"


def step_report(store: Path, out: Path, args) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.reports.load import gather
    from attngeom.reports.pdf import render

    inputs = [p for p in (store / ANALYSIS).glob("*") if p.is_file()]
    inputs += [store / "faithfulness.nc"] if (store / "faithfulness.nc").is_file() else []
    if out.is_file() and inputs and out.stat().st_mtime > max(p.stat().st_mtime for p in inputs):
        return "up to date"
    render(gather(store, store / ANALYSIS, progress=not args.quiet, n_boot=args.bootstrap,
                  seed=args.seed), out)
    return "done"


def run(args: argparse.Namespace) -> int:
    for name in ("limit", "max_length", "batch_size") + (("threads",) if args.threads else ()):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.faith_limit < 0 or args.faith_limit > args.limit:
        raise ValueError(f"--faith-limit must be between 0 and --limit ({args.limit})")
    args.threads = limit_threads(args.threads)
    out = Path(args.out)
    store = out / STORE
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    steps = [("extract", lambda: step_extract(store, args)),
             ("faithfulness", lambda: step_faithfulness(store, args)),
             ("analyze", lambda: step_analyze(store, args)),
             ("report", lambda: step_report(store, out / REPORT, args))]
    for i, (name, step) in enumerate(steps, 1):
        print(f"attngeom run [{i}/{len(steps)}] {name} ...", flush=True)
        t0 = time.perf_counter()
        status = step()
        print(f"attngeom run [{i}/{len(steps)}] {name}: {status} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"attngeom run: finished in {time.perf_counter() - start:.0f} s")
    print(f"attngeom run: report at {out / REPORT}")
    return 0
