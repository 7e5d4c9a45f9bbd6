"""Helpers of the reliability tests: run the CLI in a subprocess or in this process.

``cli_start`` runs ``python -m attngeom`` in a subprocess with one torch thread (so a run in a
subprocess and one in this process give the same bits); ``cli_main`` runs the same command in
this process (no second torch import) and returns (exit status, stdout, stderr).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
       "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}


def cli_start(*args) -> subprocess.Popen:
    """``python -m attngeom ARGS`` in a subprocess (one thread, no progress bars)."""
    return subprocess.Popen([sys.executable, "-m", "attngeom", *map(str, args)], cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.nice(5))    # the poller that kills it runs first


def cli_main(*args) -> tuple[int, str, str]:
    """The same command in this process: (exit status, stdout, stderr)."""
    import torch

    from attngeom.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in args])
            except SystemExit as exc:              # argparse errors exit
                rc = exc.code
    finally:
        torch.set_num_threads(threads)
    return rc, out.getvalue(), err.getvalue()
