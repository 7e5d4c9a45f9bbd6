"""run_all and `attngeom analyze`: files, names, dims, provenance, summary, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import attngeom.store
import tolerance as tol
from attngeom import cli
from attngeom.analysis import (RESULT_FILES, anti_alignment, convexity, decomposition, run_all,
                               sinks)
from attngeom.analysis.summary import __doc__ as SUMMARY_DOC
from synthetic_stores import geometric_store, to_compact

DIMS = {
    "sinks.nc": {"sink_rate_mean": ("layer", "head"), "is_sink_head": ("layer", "head"),
                 "sink_head_fraction": ("layer",)},
    "convexity.nc": {"beta2": ("layer", "head"), "pooled_beta2": ("layer",),
                     "vertex_ci_low": ("layer", "head"), "q_value": ("layer", "head"),
                     "interior_minimum": ("layer", "head"),
                     "analytic_vertex_iqr_high": ("layer", "head"),
                     "lowess": ("layer", "head", "grid"), "pooled_q_value": ("layer",)},
    "anti_alignment.nc": {"mean_cos": ("layer", "head"), "q_value_by": ("layer", "head"),
                          "residual_p_value": ("layer", "head"), "mixed_p_value": ("layer",)},
    "decomposition.nc": {"lmg_share": ("layer", "group", "part"),
                         "pooled_cov_share": ("group", "part"),
                         "negative_fraction": ("layer", "group"), "paper_pattern": ("layer",)},
}


@pytest.fixture(scope="module")
def store():
    ds = geometric_store(n_seq=16, n_layer=2, n_head=3, n_pos=14, seed=12)
    ds.attrs.update(config={"hidden": 8, "name": "tiny"}, has_output_bias=True,
                    not_json=object(), shape=[1, 2])
    return ds


@pytest.mark.parametrize("layout", ["dense", "compact"])
def test_run_all_writes_labeled_files(store, tmp_path, layout):
    ds = store if layout == "dense" else to_compact(store)
    results = run_all(ds, tmp_path, n_boot=20, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        list(RESULT_FILES.values()) + ["summary.csv"])
    for filename, names in DIMS.items():
        with xr.open_dataset(tmp_path / filename) as res:
            for name, dims in names.items():
                assert res[name].dims == dims, (filename, name)
            assert res.attrs["mode"] == layout and res.attrs["model"] == "synthetic"
            assert res.attrs["config"] == '{"hidden": 8, "name": "tiny"}'
            assert res.attrs["has_output_bias"] == 1 and "not_json" not in res.attrs
            assert list(res.attrs["shape"]) == [1, 2]
            assert res.attrs["analysis_sink_k"] == 1
    table = pd.read_csv(tmp_path / "summary.csv")
    documented = SUMMARY_DOC.split("Columns (stable): ")[1].split(". In row")[0].split()
    assert list(table.columns) == [c.strip("`") for c in documented]
    assert list(table["layer"].astype(str)) == ["0", "1", "all"]
    assert table["verdict"].str.len().min() > 20
    assert results["sinks"]["sink_head_count"].sum() == table["sink_head_count"].iloc[-1]


def test_run_all_matches_values_computed_from_the_store(store):
    """Sink rates, the per-head quadratic fit, the sink-value cosine and the sink group's
    covariance shares, from the synthetic store's arrays with plain numpy."""
    res = run_all(store.chunk({"sequence": 5}), None, n_boot=0, progress=False)
    S, L, H, T = (store.sizes[d] for d in ("sequence", "layer", "head", "query"))
    length = store["length"].values
    alpha = store["alpha"].transpose("sequence", "layer", "head", "query", "key").values
    out_norm = store["output_norm"].transpose("sequence", "layer", "head", "query").values
    cos = store["cosine"].transpose("sequence", "layer", "head", "query", "key").values
    vnorm = store["value_norm"].transpose("sequence", "layer", "head", "key").values
    svc = store["sink_value_cosine"].transpose("sequence", "layer", "head", "key").values
    for layer in range(L):
        for head in range(H):
            rows = [(s, i) for s in range(S) for i in range(1, length[s])]   # queries i >= k = 1
            a = np.array([alpha[s, layer, head, i, 0] for s, i in rows])
            y = np.array([out_norm[s, layer, head, i] for s, i in rows])
            at = dict(layer=layer, head=head)
            assert float(res["sinks"]["sink_rate_mean"].sel(**at)) == tol.mean_of(a).approx(
                a.mean())
            assert int(res["sinks"]["n_queries"].sel(**at)) == len(rows)
            X = np.stack([np.ones_like(a), a, a * a], 1)
            beta = np.linalg.lstsq(X, y, rcond=None)[0]
            got = [float(res["convexity"][f"beta{n}"].sel(**at)) for n in range(3)]
            # two least-squares solutions (from sums, by SVD): kappa(X)^2, of the largest |b|
            fit = tol.conditioned(len(y), np.linalg.cond(X) ** 2, tol.F64, vs=tol.F64)
            np.testing.assert_allclose(got, beta, atol=fit.rtol * np.abs(beta).max())
            per_seq = [svc[s, layer, head, 1:length[s]].mean() for s in range(S)]
            mean = tol.total(T + S, np.nanmean(np.abs(svc[:, layer, head, 1:])), tol.F64,
                             vs=tol.F64)                     # means of per-sequence means
            assert float(res["anti_alignment"]["mean_cos"].sel(**at)) == mean.approx(
                np.mean(per_seq))
        # the sink group (key 0, queries i >= 1) of this layer, pooled over heads
        parts = []
        for s in range(S):
            i = np.arange(1, length[s])
            parts.append(np.stack([np.log(alpha[s, layer, :, i, 0]),
                                   np.log(vnorm[s, layer, :, 0][None] / out_norm[s, layer, :, i]),
                                   np.log(np.abs(cos[s, layer, :, i, 0]))], -1).reshape(-1, 3))
        x = np.concatenate(parts)
        x = x[np.isfinite(x).all(1)]
        logc = x.sum(1)
        share = [np.cov(x[:, p], logc)[0, 1] / logc.var(ddof=1) for p in range(3)]
        got = res["decomposition"]["cov_share"].sel(layer=layer, group="sink")
        np.testing.assert_allclose(got.sel(part=["alpha", "ratio", "cosine"]).values, share,
                                   **tol.covariance_share(x))
        assert int(res["decomposition"]["n_pairs"].sel(layer=layer, group="sink")) == len(x)


def test_run_all_equals_the_single_analyses(store):
    """One pass over a chunked store gives what each analysis gives on its own."""
    all_ = run_all(store.chunk({"sequence": 5}), None, n_boot=20, seed=4, progress=False)
    single = {"sinks": sinks(store), "convexity": convexity(store, n_boot=20, seed=4),
              "anti_alignment": anti_alignment(store, seed=4), "decomposition":
              decomposition(store)}
    for name, ref in single.items():
        for var in ref.data_vars:
            a, b = all_[name][var].values, ref[var].values
            if a.dtype.kind in "fc":       # the same data summed in other blocks
                tol.assert_close(a, b, tol.ANALYSIS_FLOAT64 * np.nanmax(np.abs(b), initial=0),
                                 f"{name}.{var}")
            else:
                assert (a == b).all(), f"{name}.{var}"


def test_layers_option(store):
    res = run_all(store, None, layers=[1], n_boot=0, progress=False)
    assert list(res["convexity"]["layer"].values) == [1]
    assert list(res["summary"]["layer"].astype(str)) == ["1", "all"]
    open_end = run_all(store, None, layers="1:", n_boot=0, progress=False)   # to the last layer
    assert list(open_end["sinks"]["layer"].values) == [1]
    with pytest.raises(ValueError, match="--layers 2 is not in the store"):
        run_all(store, None, layers="0:3", n_boot=0, progress=False)


def test_cli_analyze(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attngeom.store, "open", lambda path: store, raising=False)
    code = cli.main(["analyze", "somewhere", "--out", str(tmp_path), "--bootstrap", "10",
                     "--seed", "3", "--epsilon", "0.4", "--layers", "0-1", "--no-progress"])
    assert code == 0
    with xr.open_dataset(tmp_path / "sinks.nc") as res:
        assert res.attrs["analysis_epsilon"] == 0.4 and res.attrs["analysis_seed"] == 3
    assert "summary.csv" in capsys.readouterr().out


def test_cli_rejects_an_empty_store(tmp_path, monkeypatch, capsys, store):
    monkeypatch.setattr(attngeom.store, "open", lambda path: store.isel(sequence=slice(0, 0)),
                        raising=False)
    code = cli.main(["analyze", "empty", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no sequences" in err[0]
    assert not list(tmp_path.iterdir())


def test_cli_rejects_bad_layers(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["analyze", "x", "--out", str(tmp_path), "--layers", "a-b"])
    assert "--layers" in capsys.readouterr().err


def test_fits_in_worker_processes_equal_fits_in_process(store):
    """The per-layer fits sent to a process pool (one layer in flight, so the pass waits on
    it) give exactly what fitting in this process gives, layer by layer in order."""
    ds = to_compact(store)
    serial = run_all(ds, n_boot=20, progress=False, fit_workers=0)
    pooled = run_all(ds, n_boot=20, progress=False, fit_workers=1)
    for name in ("convexity", "sinks", "anti_alignment", "decomposition"):
        xr.testing.assert_identical(serial[name], pooled[name])
    assert list(pooled["convexity"]["layer"].values) == list(ds["layer"].values)
    assert np.isfinite(pooled["convexity"]["lowess"].values).any()


def test_fit_workers_follow_dask():
    import dask

    from attngeom.analysis.blocks import MAX_FIT_WORKERS, default_fit_workers
    with dask.config.set(scheduler="synchronous"):
        assert default_fit_workers() == 0
    with dask.config.set(scheduler="threads", num_workers=3):
        assert default_fit_workers() == 2
    with dask.config.set(scheduler="threads", num_workers=64):
        assert default_fit_workers() == MAX_FIT_WORKERS
