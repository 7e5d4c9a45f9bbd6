"""Build the golden artifacts through the command line, in process, from a committed tiny model.

``python tests/golden/build.py OUT`` writes, under ``OUT``: a dense and a compact store, a
faithfulness result, a store merged from two ``--shard`` parts, a subset store, and the analysis
results of the golden compact store committed in ``tests/golden/data/store`` (so that the
analysis differs from its golden file by the analysis' own float64 rounding alone, not by the
float32 rounding of a rebuilt store); then :func:`flatten` turns each into one netCDF file of
its variables (``OUT/flat/<name>.nc``). ``test_golden.py`` rebuilds them with the current code
and compares variable by variable.

The model is the seeded tiny llama of ``tiny_models.py``, saved in ``data/model``: torch's
seeded initialisation draws other weights under other CPU kernels (ATEN_CPU_CAPABILITY=default
against avx2), which would change the store's content hash.

``python tests/golden/build.py --write`` regenerates the golden files themselves (from the
committed model; from a new one where ``data/model`` is missing): the compact store it builds
becomes ``data/store``, the analysis is made from that, and every flattened artifact replaces
``data/<name>.nc``. Do it only when a change of the numbers is intended (or a new output is
added), and say why in the commit.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORE = HERE / "data" / "store"              # the golden compact store, committed
MODEL = HERE / "data" / "model"              # its tiny llama, committed: torch's seeded init
                                             # draws other weights with other CPU kernels
sys.path.insert(0, str(HERE.parent))

import tiny_models as tm  # noqa: E402
from store_helpers import write_texts  # noqa: E402

N_WORDS = (3, 12, 6, 1, 8, 10, 4, 11)        # + BOS; two texts cut at --max-length 10
ARTIFACTS = ("dense", "compact", "faithfulness", "analysis", "merged", "subset")
# the golden faithfulness file's metrics, named so that new default metrics leave it as it is
METRICS = "attention,value_weighted,value_weighted_normalized,contribution,contribution_layer"


def _cli(*args) -> None:
    from attngeom.cli import main

    rc = main([str(a) for a in args])
    if rc:
        raise SystemExit(f"attngeom {' '.join(map(str, args))} exited {rc}")


def build(out: Path, store: Path | None = STORE) -> dict[str, Path]:
    """Make every artifact under ``out`` from the committed model, the analysis from ``store``
    (None: the new compact store becomes the golden one); return name -> its store/result
    directory. Threads and kernels are the environment's (the stand-ins vary them)."""
    os.environ["TQDM_DISABLE"] = "1"
    out.mkdir(parents=True, exist_ok=True)
    if store is None and not MODEL.exists():
        tm.save_tiny("llama", MODEL)
    model = MODEL
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
         "--metrics", METRICS, "--out", out / "faith")
    if store is None:                         # --write: the new compact store is the golden one
        shutil.rmtree(STORE, ignore_errors=True)
        shutil.copytree(out / "compact", STORE)
        store = STORE
    _cli("analyze", store, "--out", out / "analysis", "--bootstrap", 20, "--no-progress")
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
    write = sys.argv[1:] == ["--write"]
    if not write and len(sys.argv) != 2:
        raise SystemExit("usage: build.py OUT | build.py --write")
    out = Path(tempfile.mkdtemp(prefix="golden-")) if write else Path(sys.argv[1])
    made = build(out, store=None if write else STORE)
    flat = HERE / "data" if write else out / "flat"
    flat.mkdir(exist_ok=True)
    for name in ARTIFACTS:
        ds = flatten(name, made[name])
        for var in ds.variables.values():
            var.encoding = {}
        ds.to_netcdf(flat / f"{name}.nc", engine="h5netcdf",
                     encoding={v: {"zlib": True, "complevel": 9} for v in ds.data_vars
                               if ds[v].dtype != object})
    print(f"golden artifacts in {flat}")
    if write:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
