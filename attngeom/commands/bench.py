"""``attngeom bench WHAT [ARGS...]``: run a benchmark script from the repository's benchmarks/.

The benchmarks are scripts, not part of the installed package: this command finds the
``benchmarks/`` folder next to the package source (an editable install or a checkout) and runs
``benchmarks/bench_<WHAT>.py ARGS`` with the same Python, passing its output through (one JSON
object per line on stdout, progress on stderr). ``all`` runs every benchmark with its defaults;
``gpu`` runs ``benchmarks/gpu.py`` (the single-command GPU benchmark). ``--record ID`` also
appends one record of what it printed to ``benchmarks/records.jsonl`` (``benchmarks/records.py``):
its numbers, named by the line's ``case`` (or ``section``, ``name``) and key, are the record's
values, which the documentation and RESULTS.md's status table can then cite.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from attngeom.common.options.commands import BenchCommand
from attngeom.common.options.spec import add_arguments
from attngeom.common.vocab import BENCHMARKS
from attngeom.common.errors import Refusal

# benchmarks/bench_<name>.py, and the GPU benchmark's own script
SCRIPTS = {**{name: f"bench_{name}.py" for name in BENCHMARKS}, "gpu": "gpu.py"}
ALL = ("extract", "store", "analysis", "faithfulness")


def benchmarks_dir() -> Path:
    """The repository's ``benchmarks/`` folder, or a ValueError saying how to get one."""
    import attngeom

    folder = Path(attngeom.__file__).resolve().parent.parent / "benchmarks"
    if not (folder / SCRIPTS["extract"]).is_file():
        raise Refusal("the benchmarks/ folder is not next to this attngeom install; run "
                         "from a source checkout installed with `pip install -e .`")
    return folder


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, BenchCommand)


def run(args) -> int:
    folder = benchmarks_dir()
    names = ALL if args.what == "all" else (args.what,)
    if args.what == "all" and args.args:
        raise Refusal("`attngeom bench all` takes no extra arguments; run one benchmark "
                         "with them instead")
    status, printed = 0, []
    for name in names:
        argv = [sys.executable, str(folder / SCRIPTS[name]), *args.args]
        if args.record is None:
            status = status or _exit_status(subprocess.call(argv))
            continue
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            for line in proc.stdout:                       # passed through as it comes
                sys.stdout.write(line)
                sys.stdout.flush()
                printed.append(line)
        status = status or _exit_status(proc.returncode)
    if args.record is not None and status == 0:
        record(folder, args.record, "attngeom bench " + " ".join([args.what, *args.args]),
               printed)
    return status


def _exit_status(returncode: int) -> int:
    """A child's exit status as a shell gives it: a kill by signal N is 128 + N, not a
    negative number that would read as success next to 0."""
    return 128 - returncode if returncode < 0 else returncode


def _objects(lines: list[str]) -> list[dict]:
    """The JSON objects among the printed lines."""
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue                                      # not one of the JSON lines
        if isinstance(obj, dict):
            out.append(obj)
    return out


def values(lines: list[str]) -> dict[str, float]:
    """The numbers of the JSON objects a benchmark printed, by ``CASE__KEY`` (nested keys
    joined by ``__``; CASE is the line's ``case``, ``section`` or ``name``, else its number)."""
    out: dict[str, float] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}__{key}" if prefix else str(key), value)
        elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
            out[re.sub(r"\W", "_", prefix)] = obj

    for i, obj in enumerate(_objects(lines)):
        label = next((str(obj[k]) for k in ("case", "section", "name") if k in obj), f"line{i}")
        walk(label, {k: v for k, v in obj.items() if k != "machine"})
    return out


def record(folder: Path, ident: str, command: str, lines: list[str]) -> None:
    """Append the record ``ident`` of a benchmark's output to ``benchmarks/records.jsonl``."""
    found = values(lines)
    if not found:
        raise Refusal(f"the benchmark printed no JSON numbers to record as {ident!r}; run it "
                      "without --record")
    spec = importlib.util.spec_from_file_location("attngeom_bench_records", folder / "records.py")
    records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records)
    machine = next((o["machine"] for o in _objects(lines) if "machine" in o), None)
    records.append({"id": ident, "date": datetime.date.today().isoformat(), "command": command,
                    "values": found, **({"machine": machine} if machine else {})},
                   folder / "records.jsonl")
