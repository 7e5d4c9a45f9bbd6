"""Issues 43 and 44, "how this will be checked": a faithfulness run with every built-in metric
(the paper's four, contribution_layer, the random floor, ALTI and the norm-based method as
published and with the self key ranked by its attention part, rollout, value zeroing) at token
granularity is read in ``attngeom report`` and ``attngeom compare``.

Checked here from the stored statistics (``<run>/analysis/faithfulness_stats.nc``), not from
the code that formats them: every metric takes a place in the ranking (its adjacent steps
chain every metric run, least to most faithful), every metric but random is set against
random, every metric has an AOPC min-max in [0, 1] with random's among them; ``compare`` lays
the same ranking position and min-max out per store, cell for cell; the report's PDF holds the
ranking, the floor and the self-key tables and names each method.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pypdf

from attngeom import cli
from attngeom.analysis import equivalence as E
from attngeom.analysis.compare import compare
from attngeom.analysis.faithfulness_stats import StatsSettings, read, stats_path
from attngeom.common.metrics import BUILTIN, get


def _run(tiny, out, limit: int) -> None:
    assert cli.main(["faithfulness", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                     "--out", str(out), "--max-length", "10", "--limit", str(limit),
                     "--metrics", ",".join(BUILTIN), "--granularity", "token",
                     "--ranks", "signed", "--fractions", "0.5", "--no-drift", "--quiet",
                     "--batch-size", "3"]) == 0


def test_a_run_of_every_metric_is_read_in_the_report_and_in_compare(tiny, tmp_path, capsys):
    assert {"random", "alti", "alti_sa", "norm_residual", "norm_residual_sa", "rollout",
            "value_zeroing", "contribution_layer"} <= set(BUILTIN)
    runs = [tmp_path / "a", tmp_path / "b"]
    _run(tiny, runs[0], 6)
    shutil.copytree(runs[0], runs[1])            # a second store: compare lays them side by side
    capsys.readouterr()
    stats = read(stats_path(runs[0] / "analysis", "faithfulness", StatsSettings()))
    ranking = stats.for_variable(stats.ranking)
    for mode in ("comprehensiveness", "sufficiency"):
        steps = ranking[(ranking["mode"] == mode) & (ranking["rank"] == "signed")]
        steps = steps.sort_values("position")
        chain = [steps["lower"].iloc[0]] + list(steps["higher"])
        assert list(steps["lower"].iloc[1:]) == chain[1:-1]          # adjacent steps
        assert sorted(chain) == sorted(BUILTIN), (mode, chain)
    assert set(stats.for_variable(stats.vs_random)["metric"]) == set(BUILTIN) - {"random"}
    assert set(stats.self_key["metric"]) == set(BUILTIN)
    aopc = stats.for_variable(stats.aopc)
    signed = aopc[aopc["rank"] == "signed"]
    assert set(signed["metric"]) == set(BUILTIN)
    mm = signed["minmax_mean"].to_numpy(float)
    assert np.isfinite(mm).all() and (mm >= 0).all() and (mm <= 1).all()

    ds = compare([str(r) for r in runs], ["a", "b"], settings=StatsSettings())
    assert set(ds["metric"].values) >= set(BUILTIN)
    for r in ranking.itertuples():
        at = dict(store=0, mode=r.mode, rank=r.rank)
        assert ds["ranking_position"].sel(at | {"metric": r.lower}) == r.position
        assert ds["ranking_position"].sel(at | {"metric": r.higher}) == r.position + 1
    for r in signed.itertuples():
        np.testing.assert_array_equal(
            ds["aopc_minmax"].sel(store=0, metric=r.metric, mode=r.mode, rank=r.rank),
            r.minmax_mean)
    np.testing.assert_array_equal(ds["ranking_position"].sel(store=1),
                                  ds["ranking_position"].sel(store=0))

    pdf = tmp_path / "report.pdf"
    assert cli.main(["report", str(runs[0]), "--out", str(pdf), "--quiet"]) == 0
    text = " ".join(" ".join((p.extract_text() or "").split())
                    for p in pypdf.PdfReader(str(pdf)).pages)
    for title in ("Ranking of every metric run by mean AOPC of", "Against random on the AOPC of",
                  "own key"):
        assert title in text, title
    for name in BUILTIN:
        label = get(name).words
        assert label in text or get(name).short in text, name
    cpdf = tmp_path / "compare.pdf"
    assert cli.main(["compare", *map(str, runs), "--out", str(cpdf), "--labels", "a,b",
                     "--csv", str(tmp_path / "csv")]) == 0
    ctext = " ".join(" ".join((p.extract_text() or "").split())
                     for p in pypdf.PdfReader(str(cpdf)).pages)
    assert "Ranking position" in ctext and "AOPC min" in ctext
    # the same numbers as CSV; "round_trip" because pandas < 3's default parser can miss
    # a 17-digit float by one ulp
    table = pd.read_csv(tmp_path / "csv" / "ranking.csv", float_precision="round_trip")
    assert set(table["label"]) == {"a", "b"} and set(table["metric"]) == set(BUILTIN)
    for r in table.itertuples():
        at = dict(store=r.store, metric=r.metric, mode=r.mode, rank=r.rank)
        assert ds["aopc_minmax"].sel(at).item() == r.aopc_minmax
        assert ds["ranking_position"].sel(at).item() == r.ranking_position
    verdicts = {E.HOLDS, E.EQUIVALENT, E.REVERSED, E.INCONCLUSIVE, E.NOT_TESTABLE}
    assert set(pd.read_csv(tmp_path / "csv" / "order.csv")["verdict"]) <= verdicts
