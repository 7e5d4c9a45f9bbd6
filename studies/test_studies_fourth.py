"""Tests of the fourth study's helpers (Qwen2.5; the ranking on every model) against
hand-computed answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import export
import gu_sinks
import plan

def test_gu_variants_add_bos_rows_for_a_tokenizer_that_adds_none():
    plain = list(gu_sinks.gu_variants(False, 10, 64))
    assert [(k, b, d, o) for k, b, d, _, o in plain] == [
        ("natural", False, True, "auto"), ("random", False, True, "auto"),
        ("repeated", False, True, "auto")]
    both = list(gu_sinks.gu_variants(False, 10, 64, both=True))
    assert [(k, b, d, o) for k, b, d, _, o in both] == [
        ("natural", False, True, "auto"), ("natural", True, False, "yes"),
        ("random", False, True, "auto"), ("random", True, False, "yes"),
        ("repeated", False, True, "auto"), ("repeated", True, False, "yes")]
    assert both[2][3] == both[3][3] == "probe:random:64:10:0"      # the same tokens, BOS first
    # a BOS tokenizer (Gemma) has its six variants either way
    assert list(gu_sinks.gu_variants(True, 10, 64, both=True)) == list(
        gu_sinks.gu_variants(True, 10, 64))


def test_plan_counts_the_token_variant_and_the_value_zeroing_pilot():
    from attngeom.extract.faithfulness.experiment import FaithConfig
    every = ("attention", "value_weighted", "value_weighted_normalized", "contribution",
             "contribution_layer", "random", "alti", "norm_residual", "rollout")
    cfg = FaithConfig(task="lm", metrics=every, modes=("comprehensiveness", "sufficiency"),
                      ranks=("signed",), fractions=(0.01, 0.05, 0.2), granularity="token",
                      drift=False)
    # at token granularity the nine rank apart (vwn too): 9 x 2 modes x 3 fractions + clean
    assert plan.passes_per_batch(cfg) == 55
    vz = FaithConfig(task="lm", metrics=("value_zeroing", "contribution_layer", "alti", "random"),
                     modes=("comprehensiveness",), ranks=("signed",), fractions=(0.05, 0.2),
                     granularity="token", drift=False)
    assert plan.passes_per_batch(vz) == 9


def order_log(path: Path, rows: list[tuple[str, str, float, float]], m: int = 6) -> str:
    """An order table: (lower, higher, sd_improvement, mde) rows of comprehensiveness/signed,
    and one sufficiency row that must be ignored."""
    import pandas as pd

    frame = pd.DataFrame([dict(mode="comprehensiveness", rank="signed", lower=lo, higher=hi,
                               sd_improvement=sd, mde=mde, m_tests=m)
                          for lo, hi, sd, mde in rows]
                         + [dict(mode="sufficiency", rank="signed", lower="attention",
                                 higher="value_weighted", sd_improvement=9.0, mde=1e-4,
                                 m_tests=m)])
    frame.to_csv(path, index=False)
    return str(path)


def test_sample_size_from_the_pilot_the_targets_and_the_budget(tmp_path):
    import pandas as pd
    from scipy import stats

    import sample_size

    def mde(sd, n, m=6):                       # the design's formula, written out
        z = stats.norm.ppf(1 - 0.05 / m) + stats.norm.ppf(0.8)
        return z * sd / np.sqrt(n) * np.sqrt(np.pi / 3)

    for sd, target in ((0.06, 0.016), (0.17, 0.058), (0.01, 0.05)):
        n = sample_size.n_for(sd, 6, target)
        assert n % 4 == 0 and mde(sd, n) <= target and (n == 4 or mde(sd, n - 4) > target)
    steps = [("attention", "value_weighted"), ("value_weighted_normalized", "contribution")]
    pilot = order_log(tmp_path / "pilot.csv", [(*s, sd, 0.2) for s, sd in zip(steps,
                                                                               (0.17, 0.12))]
                      + [("value_weighted", "value_weighted_normalized", np.nan, np.nan)])
    strict = order_log(tmp_path / "smol.csv", [(*s, t, t) for s, t in zip(steps, (0.016, 0.013))])
    loose = order_log(tmp_path / "gemma.csv", [(*s, t, t) for s, t in zip(steps, (0.059, 0.058))])
    pd.DataFrame([dict(step="design1-prose", cpu_seconds_per_pass=8.0, passes_per_batch=41,
                       batch_size=4)]).to_csv(tmp_path / "plan.csv", index=False)
    pd.DataFrame([dict(step="gu", seconds=900.0, cpu_seconds=720.0),
                  dict(step="extract", seconds=3600.0, cpu_seconds=np.nan)]
                 ).to_csv(tmp_path / "timings.csv", index=False)
    base = ["--pilot", pilot, "--reference", strict, "--reference", loose,
            "--plans", str(tmp_path / "plan.csv"), "--spent", str(tmp_path / "timings.csv")]
    # 82 CPU s a text; 6 h - 0.2 h (CPU) - 1 h (wall, no CPU recorded) - 0.5 h reserve
    a = sample_size.parse(base + ["--budget-hours", "6", "--reserve-hours", "0.5"])
    n, table = sample_size.choose(a)
    need = {ref: 4 * int(np.ceil(max((mde(0.17, 1) / t1) ** 2, (mde(0.12, 1) / t2) ** 2) / 4))
            for ref, t1, t2 in ((strict, 0.016, 0.013), (loose, 0.059, 0.058))}
    budget = 4 * int((4.3 * 3600) / 82 / 4)
    assert need[loose] <= budget < need[strict] and n == budget   # the whole budget
    assert table["chosen_for"].iloc[0] == f"the budget; MDE of {loose} met"
    assert (table["n_budget"] == budget).all()
    at_n = table.set_index(["reference", "step"])
    assert (at_n.loc[loose, "mde_at_n"] <= at_n.loc[loose, "target_mde"]).all()
    assert (at_n.loc[strict, "mde_at_n"] > at_n.loc[strict, "target_mde"]).any()
    assert table.groupby("reference")["n_needed"].max().to_dict() == need
    # a budget that pays for the first reference: its n, no more
    n, table = sample_size.choose(sample_size.parse(base + ["--budget-hours", "600"]))
    assert n == need[strict] and table["chosen_for"].iloc[0] == f"MDE of {strict}"
    # a smaller budget binds below every target: its n, at least the floor
    n, table = sample_size.choose(sample_size.parse(base + ["--budget-hours", "3"]))
    assert n == 4 * int((1.8 * 3600) / 82 / 4) < need[loose]
    assert table["chosen_for"].iloc[0] == "the budget binds: no target met"
    assert sample_size.choose(sample_size.parse(base + ["--budget-hours", "1.3"]))[0] == 32
    # the decision is kept: a rerun prints the n it wrote, whatever the budget says now
    out = str(tmp_path / "n.csv")
    assert sample_size.main(base + ["--budget-hours", "3", "--out", out]) == 0
    kept = int(pd.read_csv(out)["n"].iloc[0])
    assert sample_size.main(base + ["--budget-hours", "600", "--out", out]) == 0
    assert int(pd.read_csv(out)["n"].iloc[0]) == kept



def with_random(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with a random floor: attention's losses moved by 0.3 x fraction nats towards
    less faithful (comprehensiveness lower, sufficiency higher)."""
    rnd = ds.sel(metric=["attention"]).assign_coords(metric=["random"])
    sign = xr.DataArray([1.0, -1.0], dims="mode", coords={"mode": ds["mode"]})
    rnd["ppl"] = rnd["ppl"] * np.exp(-0.3 * sign * rnd["fraction"])
    rnd["delta_ppl"] = rnd["ppl"] - rnd["clean_ppl"]
    rnd["same_ranking_as"] = (("metric", "rank"), np.array([["", "random/signed"]], dtype=object))
    per = ["ppl", "delta_ppl", "same_ranking_as"]
    out = xr.merge([xr.concat([ds[per], rnd[per]], "metric"), ds[["clean_ppl"]]])
    out.attrs = dict(ds.attrs)
    return out


def test_export_stats_ranks_every_metric_against_the_floor(tmp_path, synthetic_result):
    import pandas as pd

    from attngeom.analysis import faithfulness_stats as fs

    with xr.open_dataset(synthetic_result(tmp_path / "d1.nc")) as ds:
        ds = with_random(ds.load())
    export.export_stats(fs.compute(ds, fs.StatsSettings(n_resamples=199)), tmp_path, "d1_tok")
    ranking = pd.read_csv(tmp_path / "d1_tok_ranking.csv")
    for mode in ("comprehensiveness", "sufficiency"):
        r = ranking[(ranking["variable"] == "log_ppl_ratio") & (ranking["mode"] == mode)
                    & (ranking["rank"] == "signed")].sort_values("position")
        assert list(r["lower"]) == ["random", "attention", "value_weighted",
                                    "value_weighted_normalized"]
        assert r["higher"].iloc[-1] == "contribution"
    vs = pd.read_csv(tmp_path / "d1_tok_vs_random.csv").query(
        "variable == 'log_ppl_ratio' and mode == 'comprehensiveness' and rank == 'signed'"
    ).set_index("metric")
    log_ratio = np.log(ds["ppl"] / ds["clean_ppl"]).sel(mode="comprehensiveness", rank="signed")
    aopc = log_ratio.mean("fraction")                     # AOPC: the mean over the fractions
    for metric in ("attention", "contribution"):
        d = float((aopc.sel(metric=metric) - aopc.sel(metric="random")).mean())
        assert vs.at[metric, "mean_difference"] == pytest.approx(d) and d > 0
        assert bool(vs.at[metric, "better"])
    minmax = pd.read_csv(tmp_path / "d1_tok_minmax.csv")
    assert {"minmax_mean", "aopc_mean"} <= set(minmax.columns)
    # a run without the paper's metrics (the value-zeroing pilot's shape) exports too
    export.export_design1(synthetic_like(ds, tmp_path / "vz.nc"), tmp_path, "d1_vz")
    assert pd.read_csv(tmp_path / "d1_vz_info.csv")["n_units"].iloc[0] == ds.sizes["sequence"]


def synthetic_like(ds: xr.Dataset, path: Path) -> Path:
    """``ds`` with only contribution (as contribution_layer) and random: no step of the paper's
    order to test."""
    sub = ds.sel(metric=["contribution", "random"]).assign_coords(
        metric=["contribution_layer", "random"])
    sub["same_ranking_as"] = (("metric", "rank"), np.array([["", ""], ["", "random/signed"]],
                                                          dtype=object))
    sub.to_netcdf(path)
    return path


def test_summary_shows_a_planned_design_as_not_run_yet_with_its_pilot(tmp_path):
    import pandas as pd
    import summarize_faithfulness as sf

    folder = tmp_path / "m" / sf.FOLDER
    folder.mkdir(parents=True)
    assert sf.order_cell(tmp_path, "m") == "not run"
    pd.DataFrame({"mode": ["comprehensiveness"] * 2, "lower": ["attention", "value_weighted"],
                  "higher": ["value_weighted", "contribution"], "n": 16, "m_tests": 6,
                  "p_value": [0.01, 0.5], "mean_improvement": [0.1, 0.0],
                  "verdict": ["holds", "does not hold: equivalent within ±δ"]}
                 ).to_csv(folder / "d1_prose_pilot_order_log.csv", index=False)
    pd.DataFrame({"step": ["design1-prose", "total"], "n_units": [80, None]}
                 ).to_csv(folder / "plan.csv", index=False)
    assert sf.order_cell(tmp_path, "m") == (
        "prose: not run yet (n=80 planned, plan.csv); the pilot only (n=16, m=6): 2 distinct "
        "steps: holds 1, equivalent 1, reversed 0, inconclusive 0")
    pd.DataFrame({"step": ["design1-prose"]}).to_csv(folder / "timings.csv", index=False)
    assert sf.order_cell(tmp_path, "m").startswith("prose: the pilot only (n=16")  # ran, no CSV
    assert sf.bos_shift_details(tmp_path, ["m"]) == ""
    pd.DataFrame({"input": ["natural"], "bos": [True], "n_inputs": 100, "epsilon": 0.3,
                  "pct_sink_key0": 2.26, "pct_sink_key1": 13.84, "pct_sink_key01": 21.0,
                  "mean_alpha_key0": 0.055, "mean_alpha_key1": 0.143}
                 ).to_csv(folder / "gu_bos_shift.csv", index=False)
    assert "| m | natural | with BOS | 2.3 | 13.8 | 21.0 | 0.06 | 0.14 | 0.20 | 100 |" in \
        sf.bos_shift_details(tmp_path, ["m"])


def test_ranking_tables_follow_the_exported_statistics(tmp_path, synthetic_result):
    import pandas as pd
    import ranking

    from attngeom.analysis import faithfulness_stats as fs

    with xr.open_dataset(synthetic_result(tmp_path / "d1.nc")) as ds:
        ds = with_random(ds.load())
    folder = tmp_path / "m1" / ranking.FOLDER
    export.export_design1(synthetic_like(ds, tmp_path / "tok.nc"), folder, ranking.NAME)
    export.export_stats(fs.compute(ds, fs.StatsSettings(n_resamples=199)), folder, ranking.NAME)
    text = ranking.generated(tmp_path, ["m1", "m2"])         # m2 has not run: left out
    assert "m2" not in text and f"m1 (n={ds.sizes['sequence']})" in text
    # the order line: methods by their AOPC of the log-PPL ratio, computed here from the result
    aopc = np.log(ds["ppl"] / ds["clean_ppl"]).sel(rank="signed").mean(["fraction", "sequence"])
    line = next(s for s in text.splitlines() if s.startswith("| comprehensiveness"))
    names = [ranking.M.label(m, "short") for m in
             aopc.sel(mode="comprehensiveness").to_series().sort_values(kind="stable").index]
    steps = pd.read_csv(folder / f"{ranking.NAME}_ranking.csv").query(
        "variable == 'log_ppl_ratio' and mode == 'comprehensiveness' and rank == 'signed'"
    ).sort_values("position")
    want = names[0] + "".join(f" {ranking.SIGN[v]} {n}" for v, n in zip(steps["verdict"],
                                                                        names[1:]))
    got = " ".join(w for w in line.split("|")[3].split() if not w[0].isdigit())
    assert got == want
    rnd = float(aopc.sel(mode="comprehensiveness", metric="random"))
    cell = float(aopc.sel(mode="comprehensiveness", metric="contribution"))
    row = next(s for s in text.splitlines() if s.startswith("| contribution |"))
    assert f"({cell / rnd:.2f}×," in row                  # the ratio of means to random's
