"""Shared setup of the study helpers' tests (studies/test_*.py): the study scripts and
tests/tiny_models importable, and a synthetic design-1 result."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]


def make_synthetic_result(path: Path, n: int = 24, seed: int = 0) -> Path:
    """A design-1-shaped faithfulness result: contribution removes more than attention."""
    rng = np.random.default_rng(seed)
    metrics = ["attention", "value_weighted", "value_weighted_normalized", "contribution"]
    fractions = [0.01, 0.1, 0.2]
    clean = rng.uniform(10, 20, n)
    effect = np.array([0.0, 0.3, 0.3, 0.6])[:, None, None, None, None]
    sign = np.array([1.0, -1.0])[None, None, :, None, None]
    p = np.array(fractions)[None, None, None, :, None]
    log_ratio = p * (3 + sign * effect) + rng.normal(0, 0.05, (4, 2, 2, 3, n))
    log_ratio[2] = log_ratio[1]                                   # vwn copies vw
    log_ratio[:3, 1] = log_ratio[:3, 0]                 # magnitude = signed (non-negative)
    ppl = clean * np.exp(log_ratio)
    same = np.array([["", "attention/signed"], ["", "value_weighted/signed"],
                     ["value_weighted/signed", "value_weighted/signed"], ["", ""]], dtype=object)
    ds = xr.Dataset(
        {"ppl": (("metric", "rank", "mode", "fraction", "sequence"), ppl),
         "clean_ppl": (("sequence",), clean), "delta_ppl": (("metric", "rank", "mode",
                                                            "fraction", "sequence"), ppl - clean),
         "same_ranking_as": (("metric", "rank"), same)},
        coords={"metric": metrics, "rank": ["signed", "magnitude"],
                "mode": ["comprehensiveness", "sufficiency"], "fraction": fractions,
                "sequence": np.arange(n)},
        attrs={"loss_variable": "delta_ppl", "unit_dim": "sequence", "granularity": "head",
               "task": "lm", "layers": "all"})
    ds.to_netcdf(path)
    return path


@pytest.fixture
def synthetic_result():
    """:func:`make_synthetic_result`, for the tests that write design-1 results."""
    return make_synthetic_result
