"""`attngeom compare`: each row equals its store's own stored analyses.

Stores: the dense llama store (with a faithfulness result), the compact llama store analysed
with another ε, a random-probe and a repeated-probe store, a one-layer subset, an encoder
(bert) store, and a store never analysed. Every value is checked against the files that
`attngeom analyze` wrote into that store, read here with xarray.
"""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import xarray as xr

from attngeom.analysis.compare import compare, table1
from attngeom.analysis.faithfulness_stats import StatsSettings, read, stats_path
from attngeom.cli import main


def _analyze(store, *extra):
    assert main(["analyze", str(store), "--out", str(store / "analysis"), "--no-progress",
                 "--bootstrap", "20", *extra]) == 0
    return store


@pytest.fixture(scope="module")
def stores(tiny, dense_store, compact_store, tmp_path_factory):
    import tiny_models as tm
    from attngeom.extract.run import ExtractConfig, extract

    root = tmp_path_factory.mktemp("compare")
    dense, compact = root / "dense", root / "compact"        # copies: the fixtures are shared
    shutil.copytree(dense_store, dense)
    shutil.copytree(compact_store, compact)
    out = {"dense": _analyze(dense), "compact": _analyze(compact, "--epsilon", "0.2")}
    for kind in ("random", "repeated"):
        store = root / kind
        extract(str(tiny["model"]), f"probe:{kind}:12:6:3", store,
                ExtractConfig(mode="compact", max_length=12, tail_w=4), progress=False)
        out[kind] = _analyze(store)
    assert main(["store", "subset", str(dense), "--out", str(root / "subset"),
                 "--layers", "1"]) == 0
    out["subset"] = _analyze(root / "subset")
    bert = tm.save_tiny("bert", root / "bert-model")
    extract(str(bert), str(tiny["data"]), root / "bert", ExtractConfig(
        mode="compact", max_length=12, tail_w=4), progress=False)
    out["bert"] = _analyze(root / "bert")
    extract(str(tiny["model"]), str(tiny["data"]), root / "bare", ExtractConfig(
        mode="compact", max_length=12, tail_w=4, limit=3), progress=False)
    out["bare"] = root / "bare"
    return out


def _file(store, name):
    with xr.open_dataset(store / "analysis" / f"{name}.nc", engine="h5netcdf") as f:
        return f.load()


@pytest.fixture(scope="module")
def ds(stores):
    return compare([stores[k] for k in ("dense", "compact", "random", "repeated", "subset",
                                        "bert", "bare")])


def test_each_row_equals_its_stores_own_analyses(ds, stores):
    for i, key in enumerate(("dense", "compact", "random", "repeated", "subset", "bert")):
        sinks, conv, anti = (_file(stores[key], n) for n in ("sinks", "convexity",
                                                              "anti_alignment"))
        row = ds.isel(store=i)
        # the table copies each store's own numbers (or takes the same mean): exact
        assert row["sink_head_share"] == float(sinks["is_sink_head"].mean())
        assert row["gu_sink_head_share"] == float(sinks["gu_sink_head_share"])
        assert row["epsilon"] == sinks.attrs["epsilon"]
        assert row["convex_share"] == float(conv["convex"].mean())
        assert row["anti_aligned_share"] == float(anti["anti_aligned"].mean())
        for layer in sinks["layer"].values:
            cell = row.sel(layer=layer)
            assert cell["layer_sink_rate_mean"] == float(
                sinks["layer_sink_rate_mean"].sel(layer=layer))
            np.testing.assert_array_equal(cell["pooled_vertex"].item(),           # NaN too
                                          float(conv["pooled_vertex"].sel(layer=layer)))
        manifest = json.loads((stores[key] / "manifest.json").read_text())
        assert row["n_sequences"] == manifest["n_sequences"]
        decomposition = _file(stores[key], "decomposition")
        np.testing.assert_array_equal(row["pooled_lmg_share"].values,
                                      decomposition["pooled_lmg_share"].values)


def test_depth_kinds_and_flags(ds):
    labels = dict(zip(range(ds.sizes["store"]), ds["kind"].values))
    assert [labels[i] for i in range(4)] == ["natural", "natural", "random", "repeated"]
    # the tiny llama has 2 layers: depth = layer / 1; the subset keeps layer 1 at depth 1
    np.testing.assert_array_equal(ds["relative_depth"].values[0], [0.0, 1.0])
    subset = ds.isel(store=4)
    assert np.isnan(subset["layer_sink_rate_mean"].sel(layer=0))
    assert np.isfinite(subset["layer_sink_rate_mean"].sel(layer=1))
    assert subset["relative_depth"].sel(layer=1) == 1.0
    # ε is 0.3 in one store and 0.2 in another: the sink cells say so, convexity does not
    assert "epsilon" in ds["sink_head_share"].attrs["differs"]
    assert "epsilon" not in ds["convex_share"].attrs.get("differs", "")
    assert "level" not in ds["convex_share"].attrs.get("differs", "")   # the bare store: no vote


def test_cells_a_store_cannot_fill_say_why(ds):
    why = ds["why"].to_pandas()
    assert why.loc[5, "faithfulness"].startswith("not applicable: an encoder")
    assert "no faithfulness result" in why.loc[1, "faithfulness"]
    assert "attngeom analyze" in why.loc[6, "sinks"]
    assert np.isnan(ds["sink_head_share"].values[6])
    assert why.loc[0, "faithfulness"] == ""


def test_faithfulness_cells_are_the_stored_statistics(ds, stores):
    stats = read(stats_path(stores["dense"] / "analysis", "faithfulness", StatsSettings()))
    aopc = stats.for_variable(stats.aopc)
    for r in aopc.itertuples():                              # copies of the statistics: exact
        at = dict(store=0, metric=r.metric, mode=r.mode, rank=r.rank)
        assert ds["aopc"].sel(at) == r.aopc_mean
        np.testing.assert_array_equal(ds["aopc_minmax"].sel(at), r.minmax_mean)
    ranking = stats.for_variable(stats.ranking)                # positions: 1 = least faithful
    for r in ranking.itertuples():
        at = dict(store=0, mode=r.mode, rank=r.rank)
        assert ds["ranking_position"].sel(at | {"metric": r.lower}) == r.position
        assert ds["ranking_position"].sel(at | {"metric": r.higher}) == r.position + 1
    order = stats.for_variable(stats.order)
    assert len(order) and len(order) == ds.sizes["step"]
    for r in order.itertuples():
        step = f"{r.mode}/{r.rank}: {r.lower} → {r.higher}"
        assert ds["verdict"].sel(store=0, step=step).item() == r.verdict
        np.testing.assert_array_equal(ds["mde"].sel(store=0, step=step), r.mde)
    assert (ds["verdict"].values[[1, 2, 3, 5, 6]] == "").all()    # 4 is the dense subset


def test_another_loss_reads_its_own_statistics(ds, stores):
    """--loss log_ppl_ratio: the cells are the stored statistics of that loss, not the
    store's own (ΔPPL); a loss the statistics do not hold is refused."""
    stats = read(stats_path(stores["dense"] / "analysis", "faithfulness", StatsSettings()))
    assert stats.attrs["loss_variable"] == "delta_ppl" and "log_ppl_ratio" in stats.variables
    other = compare([stores["dense"]], ["d"], loss="log_ppl_ratio")
    aopc = stats.for_variable(stats.aopc, "log_ppl_ratio")
    for r in aopc.itertuples():
        at = dict(store=0, metric=r.metric, mode=r.mode, rank=r.rank)
        assert other["aopc"].sel(at) == r.aopc_mean
        assert other["aopc"].sel(at) != ds["aopc"].sel(at)
    assert str(other["faith_loss_variable"].values[0]) == "log_ppl_ratio"
    with pytest.raises(ValueError, match="--loss nll: .* log_ppl_ratio"):
        compare([stores["dense"]], ["d"], loss="nll")


def test_table1_pivot_of_probe_stores(ds):
    pivot = table1(ds)
    assert list(pivot.columns) == ["natural", "random", "repeated"]
    # the probes have no BOS; the natural stores' tokenizer decides theirs (the label says)
    assert list(ds["bos"].values[2:4]) == ["no", "no"]
    model = str(ds["model"].values[2])
    row = pivot.loc[model if model in pivot.index else f"{model} (BOS no)"]
    assert row["random"] == 100 * float(ds["gu_sink_head_share"].values[2])
    assert row["repeated"] == 100 * float(ds["gu_sink_head_share"].values[3])


def test_labels_must_match_stores(stores):
    with pytest.raises(ValueError, match="one per store"):
        compare([stores["dense"], stores["compact"]], ["only-one"])


def test_command_writes_pdf_csv_and_png(stores, tmp_path, capsys):
    pdf, png, csv_dir = tmp_path / "c.pdf", tmp_path / "c.png", tmp_path / "csv"
    args = [str(stores[k]) for k in ("dense", "random", "repeated", "bert")]
    assert main(["compare", *args, "--out", str(pdf), "--csv", str(csv_dir), "--png", str(png),
                 "--labels", "llama,random,repeated,bert"]) == 0
    assert pdf.read_bytes()[:5] == b"%PDF-" and png.read_bytes()[:4] == b"\x89PNG"
    with open(csv_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["store"] for r in rows] == ["llama", "random", "repeated", "bert"]
    sinks = _file(stores["random"], "sinks")
    assert float(rows[1]["gu_sink_head_share"]) == float(sinks["gu_sink_head_share"])
    assert (csv_dir / "table1.csv").is_file() and (csv_dir / "layers.csv").is_file()
    assert "wrote" in capsys.readouterr().out


def test_faithfulness_only_stores_compare_without_a_layer_page(tiny, tmp_path, capsys):
    """Result folders of `attngeom faithfulness` alone (no geometry): the PDF holds the summary
    and the faithfulness pages, no per-layer page; --png writes the ranking figure instead."""
    runs = []
    for limit, name in ((4, "a"), (6, "b")):
        out = tmp_path / name
        assert main(["faithfulness", "--model", str(tiny["model"]), "--data",
                     str(tiny["data"]), "--out", str(out), "--max-length", "10", "--limit", str(limit),
                     "--metrics", "attention,contribution,random", "--fractions", "0.5",
                     "--no-drift", "--quiet", "--batch-size", "2"]) == 0
        runs.append(str(out))
    pdf = tmp_path / "c.pdf"
    assert main(["compare", *runs, "--out", str(pdf), "--labels", "a,b"]) == 0
    from pypdf import PdfReader

    text = " ".join(page.extract_text() for page in PdfReader(pdf).pages)
    assert "Per layer" not in text and "random" in text
    assert main(["compare", *runs, "--out", str(tmp_path / "d.pdf"), "--png",
                 str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
