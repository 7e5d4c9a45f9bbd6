"""Faithfulness results inside stores: info, validate, subset, merge and export carry them.

A results-only store (``attngeom faithfulness --out NEW``: no shards, no extraction options)
and stores holding both extraction shards and a result, made from the session's tiny llama
(tests/store/conftest.py). Exported numbers are read back with plain xarray / pandas and
compared with the netCDF file; delta_ppl is recomputed as ppl - clean_ppl.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import tolerance as tol
from tiny_models import save_tiny

from attngeom.cli import main
from attngeom.extract.faithfulness.experiment import FaithConfig, faithfulness
from attngeom.extract.run import ExtractConfig, extract
from attngeom.store.format.manifest import file_sha256, read_manifest, write_manifest
from attngeom.store.ops.merge import merge
from attngeom.store.ops.subset import subset
from attngeom.store.io.validate import validate

FAITH = dict(metrics=("attention", "contribution"), fractions=(0.5,), max_length=10,
             block_size=5, batch_size=5)


def run_faith(model, data, out, **kw):
    cfg = FaithConfig(**{**FAITH, **kw})
    return faithfulness(str(model), str(data), out, cfg, progress=False, log=lambda m: None)


@pytest.fixture(scope="module")
def made(tmp_path_factory, model_dirs, texts_file):
    root = tmp_path_factory.mktemp("results")
    model = model_dirs["llama"]
    run_faith(model, texts_file, root / "only")                        # results only
    cfg = ExtractConfig(max_length=10, tail_w=3, shard_size=2)
    extract(str(model), str(texts_file), root / "both", cfg, progress=False)
    run_faith(model, texts_file, root / "both")
    for i in range(2):                                                 # parts; part 0 + result
        extract(str(model), str(texts_file), root / f"part{i}", cfg, progress=False,
                shard=f"{i}/2")
    shutil.copy(root / "both" / "faithfulness.nc", root / "part0" / "faithfulness.nc")
    m = read_manifest(root / "part0")
    m["faithfulness"] = read_manifest(root / "both")["faithfulness"]
    write_manifest(root / "part0", m)
    return root


def test_info_and_readme_of_a_results_only_store(made, capsys):
    assert main(["store", "info", str(made / "only")]) == 0
    out = capsys.readouterr().out
    assert "faithfulness results only" in out and "faithfulness.nc: task lm" in out
    assert "granularity head" in out and "2 metrics" in out and "5 units" in out
    assert main(["store", "info", str(made / "both")]) == 0
    assert "faithfulness faithfulness.nc" in capsys.readouterr().out
    text = (made / "only" / "README.txt").read_text()
    with xr.open_dataset(made / "only" / "faithfulness.nc", engine="h5netcdf") as f:
        for name, var in f.data_vars.items():
            assert f"{name} ({', '.join(var.dims)}): {var.attrs['description']}" in text, name
    assert "faithfulness.nc" in (made / "both" / "README.txt").read_text()


def test_validate_checks_the_result_file(made, tmp_path):
    assert validate(made / "only") == [] and validate(made / "both") == []
    bad = shutil.copytree(made / "both", tmp_path / "bad")
    with open(bad / "faithfulness.nc", "ab") as f:
        f.write(b"x")
    assert any("faithfulness" in p and "checksum" in p for p in validate(bad))
    (bad / "faithfulness.nc").unlink()
    assert any("missing" in p for p in validate(bad))


def test_subset_keeps_results_whole_and_refuses_results_only(made, tmp_path, capsys):
    m = subset(made / "both", tmp_path / "sub", layers="0", sequences="0:2")
    assert m["config"]["subset"]["faithfulness_kept_whole"] == ["faithfulness"]
    assert file_sha256(tmp_path / "sub" / "faithfulness.nc") == \
        file_sha256(made / "both" / "faithfulness.nc")
    assert validate(tmp_path / "sub") == []
    rc = main(["store", "subset", str(made / "only"), "--layers", "0", "--out",
               str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "no extracted sequences" in err


def test_merge_of_parts_carries_the_result_and_keeps_the_single_run_hash(made, tmp_path):
    m = merge([made / "part0", made / "part1"], tmp_path / "merged")
    assert m["config_hash"] == read_manifest(made / "both")["config_hash"]
    assert validate(tmp_path / "merged") == []
    assert file_sha256(tmp_path / "merged" / "faithfulness.nc") == \
        file_sha256(made / "both" / "faithfulness.nc")


def test_merge_joins_a_results_only_store_of_the_same_model(made, tmp_path, model_dirs,
                                                            texts_file, capsys):
    run_faith(model_dirs["llama"], texts_file, tmp_path / "r2", name="second", drift=False)
    m = merge([made / "both", tmp_path / "r2"], tmp_path / "joined")
    assert sorted(m["faithfulness"]) == ["faithfulness", "second"]
    assert m["n_sequences"] == 5 and validate(tmp_path / "joined") == []
    only = merge([made / "only", tmp_path / "r2"], tmp_path / "only2")
    assert only["kind"] == "faithfulness" and sorted(only["faithfulness"]) == \
        ["faithfulness", "second"]
    # same name, different contents (another fraction; "both" and "only" hold the same numbers
    # and differ only by their creation time, which two runs in one second share): refused
    run_faith(model_dirs["llama"], texts_file, tmp_path / "r3", fractions=(0.2,), drift=False)
    rc = main(["store", "merge", str(made / "both"), str(tmp_path / "r3"), "--out",
               str(tmp_path / "no")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "'faithfulness'" in err and "--name" in err
    # another model: refused, naming the difference
    other = save_tiny("llama", tmp_path / "llama-other", seed=7)
    run_faith(other, texts_file, tmp_path / "other", name="third", drift=False)
    rc = main(["store", "merge", str(made / "both"), str(tmp_path / "other"), "--out",
               str(tmp_path / "no2")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "another model" in err and "model." in err


@pytest.mark.parametrize("store", ["only", "both"])
def test_exports_hold_the_result_numbers(made, tmp_path, store):
    with xr.open_dataset(made / store / "faithfulness.nc", engine="h5netcdf") as f:
        f = f.load()
    main(["store", "export", str(made / store), "--format", "zarr", "--out",
          str(tmp_path / "z")])
    z = xr.open_zarr(tmp_path / "z", group="faithfulness/faithfulness").load()
    for name in ("ppl", "clean_ppl", "delta_ppl", "drift_cosine_low_after"):
        np.testing.assert_array_equal(z[name].values, f[name].values, err_msg=name)
    main(["store", "export", str(made / store), "--format", "parquet", "--out",
          str(tmp_path / "p")])
    grid = pd.read_parquet(tmp_path / "p" / "faithfulness.metric_rank_mode_fraction_sequence"
                           ".parquet")
    units = pd.read_parquet(tmp_path / "p" / "faithfulness.sequence.parquet")
    assert len(grid) == f["ppl"].size
    joined = grid.merge(units[["sequence", "clean_ppl"]], on="sequence")
    np.testing.assert_allclose(joined["delta_ppl"], joined["ppl"] - joined["clean_ppl"],
                               **tol.relative(1, tol.F64))              # one subtraction
    row = grid.set_index(["metric", "rank", "mode", "fraction", "sequence"])["ppl"]
    assert row["contribution", "signed", "sufficiency", 0.5, 3] == \
        float(f["ppl"].sel(metric="contribution", rank="signed", mode="sufficiency",
                           fraction=0.5, sequence=3))
    assert "faithfulness" in (tmp_path / "p" / "README.txt").read_text()


def test_hf_export_has_a_config_per_result_table(made, tmp_path, monkeypatch):
    """Each set of a result's dims is a dataset config that `datasets` loads offline."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets.config.HF_DATASETS_OFFLINE = True
    with xr.open_dataset(made / "both" / "faithfulness.nc", engine="h5netcdf") as f:
        f = f.load()
    assert main(["store", "export", str(made / "both"), "--format", "hf", "--tables",
                 "sequences", "--out", str(tmp_path / "hub")]) == 0
    name = "faithfulness.metric_rank_mode_fraction_sequence"
    grid = datasets.load_dataset(str(tmp_path / "hub"), name, split="train",
                                 cache_dir=str(tmp_path / "cache")).to_pandas()
    assert len(grid) == f["ppl"].size
    row = grid.set_index(["metric", "rank", "mode", "fraction", "sequence"])["ppl"]
    assert row["attention", "magnitude", "comprehensiveness", 0.5, 1] == \
        float(f["ppl"].sel(metric="attention", rank="magnitude", mode="comprehensiveness",
                           fraction=0.5, sequence=1))
    card = (tmp_path / "hub" / "README.md").read_text(encoding="utf-8")
    assert f"config_name: \"{name}\"" in card and f["ppl"].attrs["description"] in card
    assert (tmp_path / "hub" / "faithfulness.nc").is_file()
