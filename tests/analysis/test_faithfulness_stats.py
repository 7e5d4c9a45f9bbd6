"""Faithfulness statistics (attngeom.analysis.faithfulness) on synthetic results.

A planted metric order must be found (every step holds), its reverse and the null (no order)
must not produce a "holds"; AOPC is checked against the mean written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import tolerance as tol
from attngeom.analysis.faithfulness import (AOPC_COLUMNS, CURVE_COLUMNS, ORDER, aopc,
                                            aopc_summary, drift_summary, loss_curves,
                                            order_table)

METRICS = ("attention", "value_weighted", "value_weighted_normalized", "contribution",
           "contribution_layer")
FRACTIONS = (0.1, 0.2, 0.5)


def synthetic(effect_comp, effect_suff, n=30, noise=0.3, seed=0, same=None) -> xr.Dataset:
    """delta_ppl = (baseline_u + effect[mode, metric]) * p + noise; the baseline is shared by
    all metrics of a unit (paired design)."""
    rng = np.random.default_rng(seed)
    base = rng.gamma(4.0, 2.0, size=n)
    shape = (len(METRICS), 2, 2, len(FRACTIONS), n)
    loss = np.empty(shape)
    for mi in range(len(METRICS)):
        for ri in range(2):
            for oi, effect in enumerate((effect_comp, effect_suff)):
                for fi, p in enumerate(FRACTIONS):
                    loss[mi, ri, oi, fi] = (base + effect[mi]) * p + rng.normal(0, noise, n)
    same_arr = np.full((len(METRICS), 2), "", dtype=object)
    for (m, r), src in (same or {}).items():
        same_arr[METRICS.index(m), ("signed", "magnitude").index(r)] = src
    ds = xr.Dataset(
        {"delta_ppl": (("metric", "rank", "mode", "fraction", "sequence"), loss),
         "same_ranking_as": (("metric", "rank"), same_arr)},
        coords={"metric": list(METRICS), "rank": ["signed", "magnitude"],
                "mode": ["comprehensiveness", "sufficiency"], "fraction": list(FRACTIONS),
                "sequence": np.arange(n)},
        attrs={"loss_variable": "delta_ppl", "unit_dim": "sequence", "granularity": "query"})
    return ds


PLANTED = ([1.0, 2.0, 3.0, 4.0, 4.5], [4.0, 3.0, 2.0, 1.0, 0.5])


def test_aopc_is_the_mean_over_fractions():
    ds = synthetic(*PLANTED)
    a = aopc(ds)
    x = ds["delta_ppl"].values                             # float64 means of 3 fractions
    tol.assert_close(a.transpose("metric", "rank", "mode", "sequence").values,
                     (x[..., 0, :] + x[..., 1, :] + x[..., 2, :]) / 3,
                     tol.mean_of(x, 3), "aopc")
    s = aopc_summary(ds)
    assert tuple(s.columns) == AOPC_COLUMNS and set(s["variable"]) == {"delta_ppl"}
    row = s[(s.metric == "contribution") & (s["rank"] == "signed") & (s["mode"] == "sufficiency")]
    # from the raw losses (not from aopc above): per-unit means over the three fractions
    raw = x[METRICS.index("contribution"), 0, 1]                # signed, sufficiency: (P, n)
    per_unit = raw.sum(axis=0) / len(FRACTIONS)
    mean = tol.total(len(FRACTIONS) + len(per_unit), np.abs(raw).mean(), tol.F64, vs=tol.F64)
    assert row.aopc_mean.item() == mean.approx(per_unit.sum() / len(per_unit))
    sem = np.sqrt(((per_unit - per_unit.mean()) ** 2).sum() / (len(per_unit) - 1)
                  / len(per_unit))
    assert row.aopc_sem.item() == (tol.sd_of(per_unit) * (1 / np.sqrt(len(per_unit)))
                                   + tol.relative(2, tol.F64, vs=tol.F64)).approx(sem)
    assert row.n_units.item() == x.shape[-1]
    curves = loss_curves(ds)
    assert tuple(curves.columns) == CURVE_COLUMNS
    at = curves[(curves.metric == "contribution") & (curves["rank"] == "signed")
                & (curves["mode"] == "sufficiency") & (curves.fraction == 0.5)]
    assert at.loss_mean.item() == tol.mean_of(raw[2]).approx(raw[2].sum() / raw.shape[1])
    assert list(dict.fromkeys(s.metric)) == list(METRICS)        # the paper's order kept
    assert list(dict.fromkeys(s["rank"])) == ["signed", "magnitude"]
    assert list(dict.fromkeys(s["mode"])) == ["comprehensiveness", "sufficiency"]
    x = ds["delta_ppl"].sel(metric="contribution", rank="magnitude", mode="sufficiency").values
    row = s[(s.metric == "contribution") & (s["rank"] == "magnitude")
            & (s["mode"] == "sufficiency")]
    assert row.aopc_mean.item() == tol.mean_of(x).approx(x.mean())


def test_planted_order_holds_at_every_step():
    table = order_table(ds := synthetic(*PLANTED), n_resamples=2000)
    assert len(table) == 2 * 2 * (len(ORDER) - 1)
    assert table["holds"].all(), table
    assert (table["mean_improvement"] > 0).all() and (table["ci_low"] > 0).all()
    # Holm's step-down written out over the family (every step tested here): the i-th smallest
    # p times (m - i), a running maximum over i, capped at 1
    p = table["p_value"].to_numpy(dtype=float)
    m, order = len(p), np.argsort(p, kind="stable")
    holm = np.empty(m)
    holm[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    np.testing.assert_allclose(table["p_holm"].to_numpy(dtype=float), holm,   # (m - i) p:
                               **tol.relative(1, tol.F64, vs=tol.F64))            # one product
    row = table[(table["mode"] == "comprehensiveness") & (table["lower"] == "attention")
                & (table["rank"] == "signed")].iloc[0]
    a = aopc(ds).sel(mode="comprehensiveness", rank="signed")
    diff = (a.sel(metric="value_weighted") - a.sel(metric="attention")).values
    x = ds["delta_ppl"].sel(mode="comprehensiveness", rank="signed").values  # the AOPCs' terms
    mean = tol.total(2 * len(FRACTIONS) + len(diff), np.abs(x).mean(), tol.F64, vs=tol.F64)
    assert row["mean_improvement"] == (mean * 2).approx(float(diff.mean()))


def test_reversed_order_never_holds():
    comp, suff = PLANTED
    table = order_table(synthetic(comp[::-1], suff[::-1]), n_resamples=2000)
    assert not table["holds"].any()
    assert (table["mean_improvement"] < 0).all()


def test_null_gives_few_false_holds():
    """No order at all: over 20 independent data sets, 'holds' appears in <= 2 (Holm keeps the
    family-wise rate per data set near 5 %; one-sided steps halve it further)."""
    flat = [2.0] * 5
    false = sum(order_table(synthetic(flat, flat, seed=s), n_resamples=500)["holds"].any()
                for s in range(20))
    assert false <= 2


def test_identical_rankings_are_reported_not_tested():
    same = {("value_weighted_normalized", "signed"): "value_weighted/signed",
            ("value_weighted_normalized", "magnitude"): "value_weighted/signed",
            ("value_weighted", "magnitude"): "value_weighted/signed"}
    table = order_table(synthetic(*PLANTED, same=same), n_resamples=1000)
    step = table[(table["lower"] == "value_weighted")
                 & (table["higher"] == "value_weighted_normalized")]
    assert len(step) == 4 and not step["holds"].any() and step["p_value"].isna().all()
    assert step["note"].str.contains("identical ranking").all()
    tested = table[table["p_value"].notna()]
    assert len(tested) == 8 and tested["holds"].all()


def test_accuracy_loss_is_used_for_choice_tasks():
    ds = synthetic(*PLANTED).rename(sequence="item", delta_ppl="accuracy_loss")
    ds.attrs.update(loss_variable="accuracy_loss", unit_dim="item")
    assert order_table(ds, n_resamples=500)["holds"].all()


def test_drift_summary_detects_planted_cone_collapse():
    rng = np.random.default_rng(1)
    n, L = 25, 3
    before = rng.uniform(0.1, 0.4, (n, L))
    after = before + np.array([0.2, 0.0, 0.3]) + rng.normal(0, 0.02, (n, L))
    after[:, 1] = before[:, 1] + np.where(np.arange(n) % 2, 1, -1) * np.linspace(.01, .05, n)
    ds = xr.Dataset(
        {"drift_cosine_low_before": (("sequence", "layer"), before),
         "drift_cosine_low_after": (("sequence", "layer"), after),
         "drift_cosine_all_before": (("sequence", "layer"), before),
         "drift_cosine_all_after": (("sequence", "layer"), before),
         "drift_output_norm_low_before": (("sequence", "layer"), before),
         "drift_output_norm_low_after": (("sequence", "layer"), before),
         "drift_delta_ppl": ("sequence", rng.normal(3.0, 1.0, n))},
        coords={"sequence": np.arange(n), "layer": np.arange(L)},
        attrs={"unit_dim": "sequence"})
    d = drift_summary(ds)
    assert d["cosine_low_p_holm"].values[0] < 1e-3 and d["cosine_low_p_holm"].values[2] < 1e-3
    assert d["cosine_low_p_holm"].values[1] > 0.05
    assert d.attrs["loss_p_value"] < 1e-3
    tol.assert_close(d["cosine_low_change_mean"].values, (after - before).mean(0),
                     tol.mean_of(np.abs(after) + np.abs(before), 0) * 2, "change")


def test_a_step_with_the_same_rankings_under_both_ranks_is_one_test():
    """Non-negative metrics rank the same signed or by magnitude: attention -> value_weighted
    is then one hypothesis, listed under both ranks but counted once in Holm."""
    from statsmodels.stats.multitest import multipletests

    same = {("attention", "magnitude"): "attention/signed",
            ("value_weighted", "magnitude"): "value_weighted/signed"}
    ds = synthetic(*PLANTED, same=same)
    for m in ("attention", "value_weighted"):              # copies hold the same numbers
        ds["delta_ppl"].loc[dict(metric=m, rank="magnitude")] = \
            ds["delta_ppl"].sel(metric=m, rank="signed")
    table = order_table(ds, n_resamples=500)
    step = table[(table["lower"] == "attention") & (table["higher"] == "value_weighted")]
    assert len(step) == 4                                  # 2 modes x 2 ranks, listed
    for mode in ("comprehensiveness", "sufficiency"):
        pair = step[step["mode"] == mode].set_index("rank")
        assert pair.loc["magnitude", "p_value"] == pair.loc["signed", "p_value"]
        assert pair.loc["magnitude", "p_holm"] == pair.loc["signed", "p_holm"]
        assert "counted once in Holm" in pair.loc["magnitude", "note"]
    distinct = table[~table["note"].str.contains("counted once")]
    assert len(distinct) == len(table) - 2
    want = multipletests(distinct["p_value"].to_numpy(), method="holm")[1]
    np.testing.assert_array_equal(distinct["p_holm"].to_numpy(), want)   # statsmodels' own
