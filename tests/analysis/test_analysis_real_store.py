"""`attngeom analyze` on real stores extracted from a tiny random llama, dense and compact."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import xarray as xr

from attngeom import cli

pytest.importorskip("torch")
tm = pytest.importorskip("tiny_models")


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
            for var in variables:
                np.testing.assert_allclose(c[var].values.astype(float),
                                           d[var].values.astype(float), rtol=1e-3, atol=1e-5)
    with xr.open_dataset(analysed["dense"] / "decomposition.nc") as d, \
            xr.open_dataset(analysed["compact"] / "decomposition.nc") as c:
        groups = dict(group=["sink", "tail"])
        np.testing.assert_allclose(c["lmg_share"].sel(groups), d["lmg_share"].sel(groups),
                                   atol=1e-4)
        assert np.isfinite(d["lmg_share"].sel(group="middle")).all()
        # sum_j c_ij = 1: the groups' mean contribution totals add up to one
        np.testing.assert_allclose(c["total_contribution_mean"].sum("group"), 1.0, atol=1e-4)
        np.testing.assert_allclose(d["total_contribution_mean"].sum("group"), 1.0, atol=1e-4)
