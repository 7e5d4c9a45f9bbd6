"""The stored faithfulness statistics (attngeom.analysis.faithfulness_stats): computed once,
read back unchanged, recomputed when the result file or a setting changes, never stale."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import tolerance as tol
from attngeom.analysis import faithfulness_stats as FS
from attngeom.analysis._common import bootstrap_rng
from test_faithfulness_stats import PLANTED, synthetic


def _lm(n=24, seed=0):
    ds = synthetic(*PLANTED, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    ds["clean_ppl"] = (("sequence",), rng.uniform(8, 12, n))
    ds["ppl"] = ds["delta_ppl"] + ds["clean_ppl"]
    return ds


def test_round_trip_keeps_every_number(tmp_path):
    ds = _lm()
    s = FS.ensure(ds, "sha-a", tmp_path, "faithfulness", FS.StatsSettings(n_resamples=199))
    direct = FS.compute(ds, FS.StatsSettings(n_resamples=199), source_sha256="sha-a")
    assert list(s.order.columns) == list(direct.order.columns)
    for column in direct.order.columns:
        a, b = s.order[column].to_numpy(), direct.order[column].to_numpy()
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b)
        else:
            assert list(map(str, a)) == list(map(str, b)), column
    np.testing.assert_array_equal(s.aopc["aopc_mean"], direct.aopc["aopc_mean"])
    for table in ("aopc", "curves"):
        assert list(getattr(s, table).columns) == list(getattr(direct, table).columns)
        np.testing.assert_array_equal(getattr(s, table)["ci_high"], getattr(direct, table)["ci_high"])
    assert set(s.curves["variable"]) == {"delta_ppl", "log_ppl_ratio"} == set(s.variables)
    assert set(s.order["variable"]) == {"delta_ppl", "log_ppl_ratio"}
    assert s.attrs["n_resamples"] == 199 and s.attrs["source_sha256"] == "sha-a"


def test_aopc_ci_is_the_t_interval_at_the_level(tmp_path):
    ds = _lm()
    s = FS.compute(ds, FS.StatsSettings(level=0.1, n_resamples=99))
    row = s.aopc[(s.aopc.variable == "delta_ppl") & (s.aopc.metric == "contribution")
                 & (s.aopc["rank"] == "signed") & (s.aopc["mode"] == "comprehensiveness")]
    x = ds["delta_ppl"].sel(metric="contribution", rank="signed",
                            mode="comprehensiveness").mean("fraction").values
    lo, hi = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    ends = tol.t_interval(x, (hi - lo) / 2)
    assert row.ci_low.item() == ends.approx(lo)
    assert row.ci_high.item() == ends.approx(hi)


def test_order_ci_is_scipys_bca_interval_of_the_paired_improvements():
    ds = _lm(n=20)
    s = FS.compute(ds, FS.StatsSettings(n_resamples=499, seed=3))
    row = s.order[(s.order.variable == "delta_ppl") & (s.order.lower == "attention")
                  & (s.order["mode"] == "comprehensiveness") & (s.order["rank"] == "signed")]
    a = ds["delta_ppl"].mean("fraction").sel(rank="signed", mode="comprehensiveness")
    d = (a.sel(metric="value_weighted") - a.sel(metric="attention")).values
    res = stats.bootstrap((d,), np.mean, n_resamples=499, method="BCa", confidence_level=0.95,
                          **bootstrap_rng(np.random.default_rng(3)))   # rng= or random_state=
    # the same resamples: percentiles of their means, each mean within its rounding; the BCa
    # levels (normal quantiles of counts) within a few ulp
    ends = tol.mean_of(d) + tol.relative(16, tol.F64, vs=tol.F64)
    assert row.ci_low.item() == ends.approx(res.confidence_interval.low)
    assert row.ci_high.item() == ends.approx(res.confidence_interval.high)


def test_stale_statistics_are_recomputed_not_reused(tmp_path):
    ds, logged = _lm(), []
    settings = FS.StatsSettings(n_resamples=99)
    first = FS.ensure(ds, "sha-a", tmp_path, "faithfulness", settings, log=logged.append)
    path = FS.stats_path(tmp_path, "faithfulness", settings)
    assert FS.state(path, "sha-a", settings) == "current" and not logged
    changed = ds.copy(deep=True)
    changed["delta_ppl"] = changed["delta_ppl"] * 2
    again = FS.ensure(changed, "sha-b", tmp_path, "faithfulness", settings, log=logged.append)
    assert "checksum differs" in logged[-1]
    assert again.aopc["aopc_mean"].iloc[0] == 2 * first.aopc["aopc_mean"].iloc[0]  # x 2: exact
    other = FS.StatsSettings(n_resamples=99, level=0.1)
    variant = FS.ensure(changed, "sha-b", tmp_path, "faithfulness", other)
    assert FS.stats_path(tmp_path, "faithfulness", other).name == \
        "faithfulness_stats.level-0.1.n-resamples-99.nc"
    assert variant.attrs["level"] == 0.1 and path.is_file()
    assert FS.state(path, "sha-b", FS.StatsSettings(n_resamples=199)).startswith(
        "stale: made with n_resamples")
