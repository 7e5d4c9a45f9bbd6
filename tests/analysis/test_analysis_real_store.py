"""`attngeom analyze` on real stores extracted from a tiny random llama, dense and compact."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import xarray as xr

import tiny_models as tm
import tolerance as tol
from attngeom import cli
from store_helpers import model_dims


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    from attngeom.extract.run import ExtractConfig, extract

    root = tmp_path_factory.mktemp("analyze-real")
    rng = random.Random(3)
    texts = [" ".join(rng.choice(tm._WORDS[:50]) for _ in range(rng.randint(5, 12)))
             for _ in range(12)]
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = tm.save_tiny("llama", root / "model")
    out = {}
    for mode in ("dense", "compact"):
        cfg = ExtractConfig(mode=mode, max_length=12, tail_w=3, shard_size=5)
        extract(str(model), str(data), root / mode, cfg, progress=False)
        res = root / f"results-{mode}"
        assert cli.main(["analyze", str(root / mode), "--out", str(res), "--bootstrap", "20",
                         "--no-progress"]) == 0
        out[mode] = res
    return out


def test_both_layouts_give_the_same_statistics(analysed):
    for name, variables in {"sinks.nc": ["sink_rate_mean", "is_sink_head"],
                            "convexity.nc": ["beta2", "p_value", "analytic_vertex_median"],
                            "anti_alignment.nc": ["mean_cos", "residual_p_value"]}.items():
        with xr.open_dataset(analysed["dense"] / name) as d, \
                xr.open_dataset(analysed["compact"] / name) as c:
            assert d.attrs["mode"] == "dense" and c.attrs["mode"] == "compact"
            for var in variables:           # two stores that differ by float32 rounding
                tol.assert_close(c[var].values.astype(float), d[var].values.astype(float),
                                 tol.LAYOUTS_ANALYSIS, var)
    from attngeom.store import open_store

    store = open_store(analysed["dense"].parent / "dense")
    c_abs = np.nanmax(np.abs(store["contribution"]).sum("key").values)      # sum_j |c_ij|
    n = tol.attention_terms(T=store.sizes["key"], layer=1, **model_dims(tm.make_config("llama")))
    with xr.open_dataset(analysed["dense"] / "decomposition.nc") as d, \
            xr.open_dataset(analysed["compact"] / "decomposition.nc") as c:
        groups = dict(group=["sink", "tail"])
        tol.assert_close(c["lmg_share"].sel(groups).values, d["lmg_share"].sel(groups).values,
                         tol.LAYOUTS_ANALYSIS, "lmg_share")
        assert np.isfinite(d["lmg_share"].sel(group="middle")).all()
        # sum_j c_ij = 1 (float32 terms, each within gamma(N) 2 alpha ||v~|| / ||o||, summed
        # over T keys): the groups' mean contribution totals add up to one
        one = tol.sums_to_one(store.sizes["key"] + 3, depth=n, size=2 * c_abs)
        for x in (c, d):
            np.testing.assert_allclose(x["total_contribution_mean"].sum("group"), 1.0, **one)


def test_distributed_scheduler_gives_identical_results(analysed, tmp_path, monkeypatch):
    """`analyze --scheduler local:1` (a LocalCluster worker process reads the store) equals the
    in-process run variable by variable, and the CSV summary too."""
    from contextlib import contextmanager

    import pandas as pd
    from distributed import get_task_stream

    from attngeom.analysis import scheduler as dist

    real, tasks = dist.scheduler, []

    @contextmanager
    def counting(spec):                      # the real cluster, counting the tasks it ran
        with real(spec) as client, get_task_stream(client) as stream:
            yield client
        tasks.append(len(stream.data))
    monkeypatch.setattr(dist, "scheduler", counting)
    store = analysed["compact"].parent / "compact"
    out = tmp_path / "dist"
    assert cli.main(["analyze", str(store), "--out", str(out), "--bootstrap", "20",
                     "--no-progress", "--scheduler", "local:1"]) == 0
    assert len(tasks) == 1 and tasks[0] > 0               # the store was read on the cluster
    local = analysed["compact"]
    for name in ("sinks.nc", "convexity.nc", "anti_alignment.nc", "decomposition.nc"):
        with xr.open_dataset(local / name) as a, xr.open_dataset(out / name) as b:
            assert set(a.data_vars) == set(b.data_vars)
            for var in a.data_vars:
                x, y = a[var].values, b[var].values
                np.testing.assert_array_equal(y, x, err_msg=var)   # the same computation
    pd.testing.assert_frame_equal(pd.read_csv(local / "summary.csv"),
                                  pd.read_csv(out / "summary.csv"))


def test_bad_scheduler_is_one_line(analysed, tmp_path, capsys):
    store = analysed["compact"].parent / "compact"
    assert cli.main(["analyze", str(store), "--out", str(tmp_path / "x"),
                     "--scheduler", "local:zero"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scheduler" in err[0] and "local:N" in err[0]
    assert not (tmp_path / "x").exists()


def test_mixed_model_matches_statsmodels_mixedlm(analysed, monkeypatch):
    """On a real store the per-layer fits equal statsmodels MixedLM's (the former estimator)."""
    import warnings

    import statsmodels.api as sm

    from attngeom.analysis import anti_alignment
    from attngeom.store.io.reader import open_store

    module = __import__("attngeom.analysis.anti_alignment", fromlist=["x"])
    calls = []
    real = module.mixed_less_than_zero

    def spy(values, sequence):
        out = real(values, sequence)
        calls.append((values, sequence, out))
        return out

    monkeypatch.setattr(module, "mixed_less_than_zero", spy)
    anti_alignment(open_store(analysed["compact"].parent / "compact"))
    assert len(calls) >= 4
    for values, sequence, out in calls:
        ok = np.isfinite(values)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sm.MixedLM(values[ok], np.ones((ok.sum(), 1)), groups=sequence[ok]).fit(
                reml=True, gtol=1e-12, maxiter=500)
        # unbalanced (texts of several lengths): our MixedLM from the ANOVA start stops within
        # its default gradient tolerance
        tol.assert_close(np.array([out["mixed_mean_cos"], out["mixed_se"]]),
                         np.array([res.fe_params[0], res.bse_fe[0]]), tol.MIXEDLM_OPTIMIZER,
                         "mixed")
