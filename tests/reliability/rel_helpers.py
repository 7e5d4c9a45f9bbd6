"""Helpers of the reliability tests: run the CLI in a subprocess or in this process, and
compare what two runs wrote.

``cli_start`` runs ``python -m attngeom`` in a subprocess with one torch thread (so a run in a
subprocess and one in this process give the same bits); ``cli_main`` runs the same command in
this process (no second torch import) and returns (exit status, stdout, stderr).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TIMESTAMPS = {"created", "updated"}
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


# ------------------------------------------------------------ comparing two runs
def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if ".tmp-" in p.name]


ADDRESSES = {"DIMENSION_LIST", "REFERENCE_LIST"}   # HDF5 object references: file offsets


def netcdf_contents(path: Path, skip_attrs=()) -> dict:
    """Every dataset (values and attributes) and the file's attributes of a netCDF4/HDF5 file,
    read with h5py. Dimension-scale references are left out: they hold file offsets, which
    depend on how the bytes are laid out, not on what the file holds."""
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[()]
            out[f"{name}.attrs"] = {k: obj.attrs[k] for k in obj.attrs if k not in ADDRESSES}

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        out["attrs"] = {k: f.attrs[k] for k in f.attrs if k not in skip_attrs}
    return out


def assert_bitwise_equal(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys(), (where, sorted(a.keys() ^ b.keys()))
    for name in a:
        if name == "attrs" or name.endswith(".attrs"):
            assert {k: str(v) for k, v in a[name].items()} == \
                   {k: str(v) for k, v in b[name].items()}, where
            continue
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, (where, name)
        if x.dtype.kind == "f":                     # bit for bit, NaN included
            same = x.view(f"u{x.itemsize}") == y.view(f"u{y.itemsize}")
            assert same.all(), (where, name, f"{(~same).sum()} of {same.size} differ, max "
                                f"{np.nanmax(np.abs(x - y)[~same]) if (~same).any() else 0}")
        else:
            assert np.array_equal(x, y), (where, name)


def without_timestamps(obj):
    if isinstance(obj, dict):
        return {k: without_timestamps(v) for k, v in obj.items() if k not in TIMESTAMPS}
    if isinstance(obj, list):
        return [without_timestamps(v) for v in obj]
    return obj


def readme(store: Path) -> str:
    """README.txt without its ISO timestamps."""
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(\+00:00)?", "<time>",
                  (store / "README.txt").read_text())


def manifest(store: Path) -> dict:
    """The store's manifest without timestamps and without the sha256 of each file it lists,
    which is first checked against that file (hashed here).

    Two runs are compared by their files' contents (:func:`netcdf_contents`), not by these
    checksums: the bytes of a compressed file are not promised to repeat. On CI's machine two
    runs once wrote the same values and attributes in other bytes.
    """
    return without_checksums(without_timestamps(json.loads((store / "manifest.json").read_text())),
                             store)


def without_checksums(obj, store: Path):
    """``obj`` with each ``{"file": ..., "sha256": ...}`` entry's sha256 checked and removed."""
    if isinstance(obj, list):
        return [without_checksums(v, store) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if isinstance(obj.get("file"), str) and isinstance(obj.get("sha256"), str):
        digest = hashlib.sha256((store / obj["file"]).read_bytes()).hexdigest()
        assert digest == obj["sha256"], f"{store / obj['file']}: recorded sha256 is not the file's"
    return {k: without_checksums(v, store) for k, v in obj.items()
            if not (k == "sha256" and isinstance(obj.get("file"), str))}
