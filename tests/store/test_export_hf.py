"""store export --format hf: a Hugging Face dataset repository that `datasets` loads offline.

Uses the session stores of tests/store/conftest.py (tiny llama, causal; compact with sink k = 2,
tail w = 3). The folder is loaded with ``datasets.load_dataset(DIR, config)`` (offline, a
private cache) and its rows compared with the store cell by cell; row counts follow the closed
form of a causal model; the card's YAML is parsed with PyYAML and its configs must name the
files that exist.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import tolerance as tol
from attngeom.cli import main
from attngeom.store.format import schema as S


@pytest.fixture(scope="module")
def compact(stores, opened):
    return stores["llama", "compact"], opened["llama", "compact"]


def load(path, config: str, cache):
    import datasets

    datasets.config.HF_DATASETS_OFFLINE = True
    return datasets.load_dataset(str(path), config, split="train", cache_dir=str(cache))


def card_yaml(path) -> dict:
    text = (path / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_hf_export_loads_with_datasets(compact, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, ds = compact
    out = tmp_path / "hub"
    assert main(["store", "export", str(path), "--format", "hf", "--license", "cc-by-4.0",
                 "--out", str(out)]) == 0
    assert "hf upload USER/NAME" in capsys.readouterr().out
    meta = card_yaml(out)
    assert meta["license"] == "cc-by-4.0" and "attngeom" in meta["tags"]
    configs = {c["config_name"]: c for c in meta["configs"]}
    assert list(configs) == ["per_query", "per_key", "pairs", "sequences", "tokens"]
    assert configs["per_query"].get("default") is True
    n_shards = 2
    for name, c in configs.items():
        (files,) = [f["path"] for f in c["data_files"] if f["split"] == "train"]
        assert len(sorted(out.glob(files))) == n_shards, name
    assert (out / "manifest.source.json").is_file()

    n = ds["length"].values.astype(int)
    L, H = ds.sizes["layer"], ds.sizes["head"]
    q = load(out, "per_query", tmp_path / "cache").to_pandas()
    assert len(q) == L * H * n.sum()
    dims = ("sequence", "layer", "head", "query")
    idx = tuple(q[d].to_numpy() for d in dims)
    for name in ("output_norm", "head_share", "middle_contribution"):
        np.testing.assert_array_equal(q[name].to_numpy(), ds[name].transpose(*dims).values[idx])
    p = load(out, "pairs", tmp_path / "cache").to_pandas()
    k, w = ds.sizes["sink"], ds.sizes["lag"]
    sink, tail = p[p["group"] == "sink"], p[p["group"] == "tail"]
    assert len(sink) == L * H * sum(min(k, i + 1) for m in n for i in range(m))
    assert len(tail) == L * H * sum(max(0, min(w, i + 1 - k)) for m in n for i in range(m))
    j = tail.merge(load(out, "per_key", tmp_path / "cache").to_pandas(),
                   on=["sequence", "layer", "head", "key"]).merge(
        q, on=["sequence", "layer", "head", "query"])
    np.testing.assert_allclose(j["contribution"],                     # c = α‖ṽ‖cos/‖o‖
                               j["alpha"] * j["value_norm"] * j["cosine"] / j["output_norm"],
                               **tol.relative(3, vs=tol.F32))    # float32, in another order
    t = load(out, "tokens", tmp_path / "cache")
    assert t.num_rows == n.sum() and "token" in t.column_names

    card = (out / "README.md").read_text(encoding="utf-8")
    for name in ("output_norm", "value_norm", "alpha", "middle_count", "token_id"):
        assert S.DESCRIPTIONS[name].replace("|", "/") in card, name
    assert ds.attrs["config_hash"] in card and "hf upload" in card


def test_no_text_leaves_token_strings_out(compact, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path, _ = compact
    assert main(["store", "export", str(path), "--format", "hf", "--no-text", "--tables",
                 "tokens,sequences", "--out", str(tmp_path / "hub")]) == 0
    t = load(tmp_path / "hub", "tokens", tmp_path / "cache")
    assert "token" not in t.column_names and "token_id" in t.column_names
    assert [c["config_name"] for c in card_yaml(tmp_path / "hub")["configs"]] == [
        "sequences", "tokens"]
    assert card_yaml(tmp_path / "hub")["license"] == "unknown"
    assert "--no-text" in (tmp_path / "hub" / "README.md").read_text(encoding="utf-8")
    import pandas as pd

    assert main(["store", "export", str(path), "--format", "parquet", "--no-text", "--tables",
                 "tokens", "--out", str(tmp_path / "pq")]) == 0       # zarr: the same drop
    assert "token" not in pd.read_parquet(tmp_path / "pq" / "tokens.parquet").columns
    assert "--no-text" in (tmp_path / "pq" / "README.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("args, word", [
    (["--format", "parquet", "--license", "mit"], "--license applies"),
    (["--format", "hf", "--license", "MIT License"], "--license 'MIT License'"),
])
def test_hf_option_errors(compact, tmp_path, capsys, args, word):
    path, _ = compact
    assert main(["store", "export", str(path), *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "\n" not in err
    assert not (tmp_path / "x").exists()
