"""Build the golden artifacts through the command line, in process, from a tiny seeded model.

``python tests/golden/build.py OUT`` writes, under ``OUT``: a dense and a compact store, a
faithfulness result, the analysis results of the compact store, a store merged from two
``--shard`` parts and a subset store; then :func:`flatten` turns each into one netCDF file of
its variables (``OUT/flat/<name>.nc``). The files in ``tests/golden/data`` were made this way at
commit 09066ea; ``test_golden.py`` rebuilds them with the current code and compares variable by
variable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import tiny_models as tm  # noqa: E402
from store_helpers import write_texts  # noqa: E402

N_WORDS = (3, 12, 6, 1, 8, 10, 4, 11)        # + BOS; two texts cut at --max-length 10
ARTIFACTS = ("dense", "compact", "faithfulness", "analysis", "merged", "subset")


def _cli(*args) -> None:
    from attngeom.cli import main

    rc = main([str(a) for a in args])
    if rc:
        raise SystemExit(f"attngeom {' '.join(map(str, args))} exited {rc}")


def build(out: Path) -> dict[str, Path]:
    """Make every artifact under ``out``; return name -> its store/result directory."""
    import torch

    torch.set_num_threads(1)
    os.environ["TQDM_DISABLE"] = "1"
    out.mkdir(parents=True, exist_ok=True)
    model = tm.save_tiny("llama", out / "model")
    data = write_texts(out / "texts.jsonl", N_WORDS)
    common = ["--model", model, "--data", data, "--max-length", 10, "--quiet"]
    _cli("extract", *common, "--mode", "dense", "--batch-size", 2, "--out", out / "dense")
    _cli("extract", *common, "--mode", "compact", "--sink-k", 2, "--tail-w", 3,
         "--batch-size", 3, "--shard-size", 3, "--out", out / "compact")
    for i in range(2):
        _cli("extract", *common, "--mode", "compact", "--sink-k", 2, "--tail-w", 3,
             "--batch-size", 3, "--shard-size", 3, "--shard", f"{i}/2", "--out", out / f"part-{i}")
    _cli("store", "merge", out / "part-0", out / "part-1", "--out", out / "merged")
    _cli("store", "subset", out / "compact", "--layers", "1", "--heads", "0:3",
         "--sequences", "1:6", "--no-text", "--out", out / "subset")
    _cli("faithfulness", "--model", model, "--data", data, "--max-length", 10, "--quiet",
         "--limit", 6, "--fractions", "0.2,0.5", "--batch-size", 2, "--block-size", 4,
         "--out", out / "faith")
    _cli("analyze", out / "compact", "--out", out / "analysis", "--bootstrap", 20,
         "--no-progress")
    return {"dense": out / "dense", "compact": out / "compact", "merged": out / "merged",
            "subset": out / "subset", "faithfulness": out / "faith" / "faithfulness.nc",
            "analysis": out / "analysis"}


def flatten(name: str, path: Path):
    """One xarray.Dataset of an artifact's variables (stores: every shard concatenated)."""
    import glob

    import xarray as xr

    if name == "faithfulness":
        with xr.open_dataset(path, engine="h5netcdf") as f:
            ds = f.load()
        ds.attrs = {}              # provenance: paths and times of this run
        return ds
    if name == "analysis":
        parts = []
        for file in sorted(path.glob("*.nc")):
            with xr.open_dataset(file, engine="h5netcdf") as f:
                ds = f.load()
            parts.append(ds.rename({v: f"{file.stem}.{v}" for v in ds.data_vars}))
        merged = xr.merge(parts, compat="override", join="outer", combine_attrs="drop")
        merged.attrs["summary_csv"] = (path / "summary.csv").read_text()
        return merged
    files = sorted(glob.glob(str(path / "shards" / "*.nc")))
    ds = xr.open_mfdataset(files, engine="h5netcdf", combine="nested", concat_dim="sequence",
                           data_vars="minimal", coords="minimal", compat="override").load()
    manifest = json.loads((path / "manifest.json").read_text())
    ds.attrs = {"config_hash": manifest["config_hash"],
                "shards": json.dumps([e["sequences"] for e in manifest["shards"]])}
    return ds


def main() -> None:
    out = Path(sys.argv[1])
    made = build(out)
    flat = out / "flat"
    flat.mkdir(exist_ok=True)
    for name in ARTIFACTS:
        ds = flatten(name, made[name])
        for var in ds.variables.values():
            var.encoding = {}
        ds.to_netcdf(flat / f"{name}.nc", engine="h5netcdf",
                     encoding={v: {"zlib": True, "complevel": 9} for v in ds.data_vars
                               if ds[v].dtype != object})
    print(f"golden artifacts in {flat}")


if __name__ == "__main__":
    main()
