"""The PDF report (attngeom.reports) and the `report` / `run` commands, on real tiny stores.

Summary numbers are recomputed here from the store and the faithfulness file with plain numpy
(sink heads, ΔPPL of the drift pass, AOPC) or read from the analysis files, formatted to three
significant digits, and looked up in the PDF's text.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pypdf
import pytest
import xarray as xr

import tolerance as tol
from attngeom import cli
from attngeom.reports import SECTIONS, build_report
from attngeom.reports.summary import fmt
from attngeom.store import open_store
from attngeom.store.options.stages import AnalysisOptions

EPSILON = 0.19             # splits the tiny model's heads into sink and non-sink heads
QUIET = dict(progress=False, log=lambda m: None, options=AnalysisOptions(n_boot=20))
SPLIT = dict(QUIET, options=AnalysisOptions(epsilon=EPSILON, n_boot=20))


def sig3(x) -> str:
    """Three significant digits in plain notation, made independently of ``fmt`` (numpy's
    Dragon4 positional formatting): the expected strings must not come from the code tested."""
    x = float(x)
    assert np.isfinite(x) and (x == 0 or 1e-4 <= abs(x) < 1e6), x   # fmt's plain range
    return "0" if x == 0 else np.format_float_positional(x, precision=3, unique=False,
                                                         fractional=False, trim="-")


def pdf_text(path) -> str:
    reader = pypdf.PdfReader(str(path))
    return " ".join(" ".join((p.extract_text() or "") for p in reader.pages).split())


@pytest.fixture(scope="module")
def full_report(dense_store, tmp_path_factory):
    path = build_report(dense_store, tmp_path_factory.mktemp("pdf") / "full.pdf", **SPLIT)
    return path, pdf_text(path)


def test_format_is_three_significant_digits():
    assert [fmt(x) for x in (0.123456, -0.0441, 7624.3, 999.5, 1.5e6, 2e-5, np.nan, None,
                             -0.0)] == ["0.123", "-0.0441", "7620", "1000", "1.5e+06", "2e-05",
                                        "n/a", "n/a", "0"]
    values = np.random.default_rng(0).uniform(-4, 5.9, 2000)
    values = np.concatenate([10 ** values, -(10 ** values[:500]), [0.0, 99.95, 0.19]])
    assert [fmt(x) for x in values] == [sig3(x) for x in values]


SINK_PAGES = """
import sys
import numpy as np, xarray as xr
from attngeom.reports.figures import sinks
assert "seaborn" not in sys.modules
dims, rate = ("layer", "head"), np.linspace(0, 1, 6).reshape(2, 3)
ds = xr.Dataset({"sink_rate_mean": (dims, rate), "learned_sink_rate_mean": (dims, rate),
                 "is_sink_head": (dims, rate > 0.5),
                 "sink_head_fraction": ("layer", [0.3, 0.6]),
                 "layer_sink_rate_mean": ("layer", [0.2, 0.7]),
                 "sink_head_count": ("layer", [1, 2])},
                coords={"layer": [0, 1], "head": [0, 1, 2]})
pages = sinks.pages(ds)
import seaborn
for page in pages:
    cmap = page.fig.axes[0].collections[0].get_cmap()
    assert cmap.name == "rocket_r" and cmap(0.3) == seaborn.cm.rocket_r(0.3), cmap.name
print(len(pages))
"""


def test_sink_heads_pages_draw_seaborns_colormap_without_seaborn_imported_first():
    # section_pages can run outside style() (which imports seaborn): "rocket_r" is seaborn's
    out = subprocess.run([sys.executable, "-c", SINK_PAGES], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2"]


def test_full_report_has_every_section_and_embedded_truetype_fonts(full_report):
    path, text = full_report
    for title in SECTIONS:
        assert f"{title}: page" in text, title              # contents line on the title page
        assert f"· {title} · page" in text, title           # the section's own page header
    assert "left out" not in text
    for page in pypdf.PdfReader(str(path)).pages:
        fonts = page["/Resources"]["/Font"]
        subtypes = {str(f.get_object()["/Subtype"]) for f in fonts.values()}
        assert subtypes and subtypes <= {"/TrueType", "/Type0"}, subtypes   # not Type 3


def test_sink_heads_sentence_matches_the_store(dense_store, full_report):
    _, text = full_report
    ds = open_store(dense_store)
    alpha0 = ds["alpha"].isel(key=0).transpose("sequence", "layer", "head", "query").values
    rate = np.nanmean(alpha0[..., 1:], axis=(0, 3))             # queries i >= 1, (L, H)
    heads = rate > EPSILON
    assert 0 < heads.sum() < heads.size                          # a check that can fail
    with xr.open_dataset(dense_store / "analysis" / "sinks.nc") as sinks:
        # a mean of n float32 values (the analysis sums each block in float32)
        n = int((~np.isnan(alpha0[..., 1:])).sum((0, 3)).max())
        tol.assert_close(sinks["sink_rate_mean"].values, rate, tol.total(n, rate, vs=tol.F64),
                         "sink_rate_mean")
    assert (f"Sink heads: {int(heads.sum())} of {heads.size} heads (fraction "
            f"{sig3(heads.mean())}) attend to the sink with a mean rate above {sig3(EPSILON)}") \
        in text
    layer = int(np.argmax(rate.mean(1)))
    assert f"most sink-heavy layer is layer {layer} (mean sink rate {sig3(rate[layer].mean())})" \
        in text


def test_analysis_sentences_quote_the_analysis_results(dense_store, full_report):
    _, text = full_report
    res = dense_store / "analysis"
    with xr.open_dataset(res / "sinks.nc") as s, xr.open_dataset(res / "convexity.nc") as c, \
            xr.open_dataset(res / "anti_alignment.nc") as a, \
            xr.open_dataset(res / "decomposition.nc") as d:
        layer = int(s["layer"].values[int(np.argmax(s["layer_sink_rate_mean"].values))])
        v = c.sel(layer=layer)
        assert (f"in layer {layer} the fitted vertex is α* = {sig3(v['pooled_vertex'])}, 95% CI "
                f"[{sig3(v['pooled_vertex_ci_low'])}, {sig3(v['pooled_vertex_ci_high'])}]") in text
        assert f"{int(c['pooled_convex'].sum())} of {c.sizes['layer']} layers" in text
        assert (f"semantic values is {sig3(a['mean_cos'].mean())} over heads, with "
                f"{int(a['anti_aligned'].sum())} of {a['mean_cos'].size} heads") in text
        assert " ".join(d.attrs["verdict"].split()) in text


def test_faithfulness_and_drift_numbers_match_the_file(dense_store, full_report):
    _, text = full_report
    with xr.open_dataset(dense_store / "faithfulness.nc", engine="h5netcdf") as f:
        f = f.load()
    drift = float(np.mean(f["drift_ppl"].values - f["clean_ppl"].values))
    assert f"ΔPPL = {sig3(drift)}" in text
    comp = (f["ppl"] - f["clean_ppl"]).sel(mode="comprehensiveness", rank="signed")
    aopc = comp.mean("fraction").mean("sequence")
    for metric, label in (("attention", "attention"), ("contribution", "contribution")):
        assert f"{label} ({sig3(aopc.sel(metric=metric))})" in text
    assert "AOPC of ΔPPL" in text and "The paper's order on the AOPC of ΔPPL" in text
    assert "The paper's order on the AOPC of log(PPL / clean PPL), nats" in text


def test_compact_store_without_text_or_faithfulness(compact_store, tmp_path):
    path = build_report(compact_store, tmp_path / "compact.pdf", **QUIET)
    text = pdf_text(path)
    assert "Faithfulness: left out — not run for this store (run `attngeom faithfulness" in text
    assert "Semantic drift: left out" in text
    for title in ("Sink heads", "Convexity", "Anti-alignment", "Decomposition",
                  "Example sequence"):
        assert f"· {title} · page" in text
    assert "ΔPPL against removal fraction" not in text     # nothing drawn empty
    assert "compact store keeps only the sink key" in text
    assert "token ids (#id)" in text
    assert "middle keys: no elementwise values" in text


def test_report_command_and_one_line_errors(compact_store, dense_store, tmp_path, capsys):
    out = tmp_path / "cli.pdf"
    assert cli.main(["report", str(compact_store), "--out", str(out), "--no-progress",
                     "--bootstrap", "10"]) == 0
    assert out.is_file() and str(out) in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "nowhere"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attngeom: error:") and "not a store" in err[0]
    # results of another store are refused, never overwritten
    build_report(dense_store, tmp_path / "d.pdf", **SPLIT)
    assert cli.main(["report", str(compact_store), "--analysis", str(dense_store / "analysis"),
                     "--out", str(tmp_path / "x.pdf"), "--no-progress"]) == 2
    assert "another store" in capsys.readouterr().err


def test_main_job_runs_every_step_then_skips_them(tiny, tmp_path, capsys, monkeypatch):
    import torch

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")                 # `run` sets them; restored afterwards
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--model", str(tiny["model"]), "--data",
            str(tiny["data"]), "--limit", "6", "--max-length", "12", "--faith-limit", "4",
            "--metrics", "attention,contribution", "--fractions", "0.5", "--bootstrap", "10",
            "--quiet"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    report = out / "report.pdf"
    assert report.is_file() and f"report at {report}" in first
    assert (out / "store" / "faithfulness.nc").is_file()
    assert (out / "store" / "analysis" / "summary.csv").is_file()
    stamp = report.stat().st_mtime_ns
    assert cli.main(argv) == 0
    second = capsys.readouterr().out
    for step in ("extract", "faithfulness", "analyze", "report"):
        assert f"{step}: up to date" in second
    assert report.stat().st_mtime_ns == stamp
    # one staleness rule: other analysis settings rerun the analyses, and so the report
    assert cli.main([*argv, "--seed", "3"]) == 0
    third = capsys.readouterr().out
    assert "extract: up to date" in third and "faithfulness: up to date" in third
    assert "analyze: done (made with other settings)" in third
    assert "report: done (older than its inputs)" in third and report.stat().st_mtime_ns > stamp
    text = pdf_text(report)
    assert "· Faithfulness · page" in text and "· Semantic drift · page" in text


def test_too_few_sequences_leave_untestable_parts_out(tiny, tmp_path):
    """Two sequences: no clustered fit, no per-head test; said in words, nothing drawn empty."""
    from attngeom.extract.run import ExtractConfig, extract

    store = tmp_path / "two"
    extract(str(tiny["model"]), str(tiny["data"]), store,
            ExtractConfig(mode="dense", max_length=12, limit=2), progress=False)
    text = pdf_text(build_report(store, tmp_path / "two.pdf", **QUIET))
    assert ("Anti-alignment: left out — not testable: 2 sequence(s); sequences are the "
            "replicates") in text
    assert "Anti-alignment: not testable with 2 sequences" in text
    assert "the vertex is not estimable (2 sequences; the sequence-clustered fit needs at " \
           "least 3)" in text
    assert "Convexity: the vertex per layer" not in text            # that page is left out
    assert "so the per-layer vertex page is left out" in text


def test_results_only_store_reports_faithfulness_and_says_why_the_rest_is_missing(tiny,
                                                                                  tmp_path):
    from attngeom.extract.faithfulness.experiment import FaithConfig, faithfulness

    store = tmp_path / "results-only"
    faithfulness(str(tiny["model"]), str(tiny["data"]), store,
                 FaithConfig(metrics=("attention", "contribution"), fractions=(0.5,),
                             max_length=12, limit=4, batch_size=4), progress=False,
                 log=lambda m: None)
    text = pdf_text(build_report(store, tmp_path / "r.pdf", **QUIET))
    assert "· Faithfulness · page" in text and "· Semantic drift · page" in text
    for title in ("Sink heads", "Convexity", "Anti-alignment", "Decomposition",
                  "Example sequence"):
        assert f"{title}: left out — the store holds faithfulness results only" in text
    assert "faithfulness results only (no extracted sequences)" in text


def test_sink_strips_are_the_store_values(compact_store):
    """α_i0 (mean over heads) and Σ_h C_i0^h per query, against plain numpy on the store."""
    from attngeom.reports.figures.sink_strip import sink_strips

    ds = open_store(compact_store)
    alpha, contrib = sink_strips(ds, 1, 0)
    a = ds["alpha"].isel(sequence=1, layer=0, sink=0).transpose("head", "query").values
    v = ds["value_norm"].isel(sequence=1, layer=0, key=0).values             # (H,)
    cos = ds["cosine_layer"].isel(sequence=1, layer=0, sink=0).transpose("head", "query").values
    norm = ds["layer_output_norm"].isel(sequence=1, layer=0).values          # (Q,)
    n = int(ds["length"].values[1])
    H = a.shape[0]                      # float32 means and sums over the heads, 3 products
    tol.assert_close(alpha[:n], a.mean(0)[:n], tol.total(H, a.mean(0)[:n], vs=tol.F32), "alpha")
    terms = a.astype(float) * v[:, None] * cos / norm
    tol.assert_close(contrib[:n], terms.sum(0)[:n],
                     tol.dot(H + 3, np.abs(terms).sum(0)[:n], vs=tol.F32), "contribution")


def test_faithfulness_is_not_suggested_for_an_encoder(tmp_path):
    from attngeom.reports.documents.load import read_faithfulness

    enc = {"config": {"model": {"causal": False, "spec": "minilm-l6"}}}
    ds, stats, why = read_faithfulness(tmp_path, enc, "faithfulness")
    assert ds is None and stats is None and "not applicable" in why and "attngeom faithfulness" not in why
    dec = {"config": {"model": {"causal": True, "spec": "smollm2-135m"}}}
    assert "attngeom faithfulness" in read_faithfulness(tmp_path, dec, "faithfulness")[2]


def _printed_tables(out: str) -> dict[str, list[list[str]]]:
    """Title -> rows (header first) of every table ``attngeom faithfulness`` printed."""
    from attngeom.reports.faithfulness_tables import parse_text

    blocks = [b for b in out.split("\n\n") if b.strip()]
    return {b.splitlines()[0].rstrip(":"): parse_text(b) for b in blocks
            if " | " in b and b.splitlines()[0].endswith(":")}


def test_the_command_prints_the_pdfs_faithfulness_tables_on_both_loss_scales(tiny, tmp_path,
                                                                              capsys):
    """Issue 42: the order tables `attngeom faithfulness` prints (ΔPPL and the log PPL ratio in
    nats) are in `attngeom report`'s PDF, every row cell for cell, and so is every other table
    it prints."""
    store, pdf = tmp_path / "store", tmp_path / "report.pdf"
    rc = cli.main(["faithfulness", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                   "--out", str(store), "--metrics",
                   "attention,value_weighted,contribution,random", "--fractions", "0.2,0.5",
                   "--max-length", "16", "--no-drift", "--quiet"])
    printed = _printed_tables(capsys.readouterr().out)
    assert rc == 0 and cli.main(["report", str(store), "--out", str(pdf), "--quiet"]) == 0
    text = pdf_text(pdf)
    orders = [t for t in printed if t.startswith("The paper's order on the AOPC of")]
    assert [t.split(" of ", 1)[1].split(" (")[0] for t in orders] == [
        "ΔPPL", "log(PPL / clean PPL), nats"]
    for kind in ("Ranking of every metric run by mean AOPC of", "Against random on the AOPC of"):
        assert len([t for t in printed if t.startswith(kind)]) == 2, kind   # both scales
    tested = 0
    for title, rows in printed.items():
        assert title in text, title
        for row in rows[1:]:
            assert " ".join(" ".join(row).split()) in text, (title, row)   # the row, in order
        tested += sum(row[-1] != "not testable" for row in rows[1:]) if title in orders else 0
    assert tested >= 8                              # 2 steps x 2 modes x 2 ranks x 2 scales
