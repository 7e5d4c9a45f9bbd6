"""The demo's cost: ``attngeom run --out DIR`` (what ``make demo`` runs) timed as a fresh process.

Prints one JSON object: the whole command's wall time, each step's seconds as the command logs
them (``attngeom run [i/n] STEP: ... (N s)``), the process's peak resident memory and the
machine. ``--record`` also appends it to ``benchmarks/records.jsonl`` as the ``demo`` record,
from which README.md and the documentation state the demo's time (``python docs/generate.py``).

    python benchmarks/bench_demo.py --record          # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, machine  # noqa: E402
import records  # noqa: E402

STEP = re.compile(r"attngeom run \[\d+/\d+\] (\w+): .*\((\d+) s\)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true", help="append to benchmarks/records.jsonl")
    p.add_argument("--keep", help="run into this folder and keep it (default: a temporary one)")
    args = p.parse_args(argv)
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="attngeom-demo-"))
    if out.exists() and args.keep is None:
        shutil.rmtree(out)
    attngeom = Path(sys.executable).with_name("attngeom")
    command = [str(attngeom), "run", "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log = done.stdout + done.stderr
    if done.returncode != 0:
        print(log, file=sys.stderr)
        return done.returncode
    steps = {name: float(s) for name, s in STEP.findall(log)}
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024     # KiB -> MiB
    where = machine()
    rec = emit({"id": "demo", "date": datetime.date.today().isoformat(),
                "command": "make demo (attngeom run --out runs/demo), a fresh process",
                "script": "python benchmarks/bench_demo.py --record",
                "values": {"wall_s": round(wall, 1), "peak_rss_mib": round(peak),
                           **{f"{k}_s": v for k, v in steps.items()},
                           "load_avg_1m": round(where.get("load_avg_1m", 0.0), 1)},
                "machine": where})
    if args.keep is None:
        shutil.rmtree(out, ignore_errors=True)
    if args.record:
        records.append(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
