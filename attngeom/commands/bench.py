"""``attngeom bench WHAT [ARGS...]``: run a benchmark script from the repository's benchmarks/.

The benchmarks are scripts, not part of the installed package: this command finds the
``benchmarks/`` folder next to the package source (an editable install or a checkout) and runs
``benchmarks/bench_<WHAT>.py ARGS`` with the same Python, passing its output through (one JSON
object per line on stdout, progress on stderr). ``all`` runs every benchmark with its defaults;
``gpu`` runs ``benchmarks/gpu.py`` (the single-command GPU benchmark).
"""

from __future__ import annotations

import argparse
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
    status = 0
    for name in names:
        argv = [sys.executable, str(folder / SCRIPTS[name]), *args.args]
        status = max(status, subprocess.call(argv))
    return status
