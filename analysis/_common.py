"""Small helpers shared by the analyses: false-discovery control, the bootstrap's random
generator argument, provenance attributes, and the wording of the parameters they all take."""

from __future__ import annotations

import json
import re

import numpy as np
import xarray as xr
from statsmodels.stats.multitest import multipletests


def fdr(p: np.ndarray, method: str = "fdr_bh") -> np.ndarray:
    """q-values (statsmodels ``multipletests``) over all finite entries of ``p``; NaN stays NaN."""
    p = np.asarray(p, dtype=float)
    q = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        q[ok] = multipletests(p[ok], method=method)[1]
    return q


def bootstrap_rng(rng: np.random.Generator) -> dict:
    """``scipy.stats.bootstrap``'s generator keyword: ``rng`` (SciPy >= 1.15) or
    ``random_state`` (older releases pyproject admits); the same draws either way."""
    import inspect

    from scipy import stats

    key = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {key: rng}


def one_sided_from_two(p_two: float, stat: float, greater: bool) -> float:
    """One-sided p-value from a symmetric two-sided test (H1: effect > 0 if ``greater``)."""
    if not np.isfinite(p_two) or not np.isfinite(stat):
        return np.nan
    agrees = stat > 0 if greater else stat < 0
    return p_two / 2 if agrees else 1 - p_two / 2


def json_attrs(attrs: dict) -> dict:
    """The JSON-serializable store attributes, as netCDF-storable values (dicts become JSON)."""
    out = {}
    for key, value in attrs.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, np.ndarray):
            value = value.tolist()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        if isinstance(value, bool):
            value = int(value)
        elif value is None:
            value = "null"
        elif isinstance(value, (dict, list, tuple)) and not (
                isinstance(value, (list, tuple)) and value
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            value = json.dumps(value)
        out[str(key)] = value
    return out


def with_provenance(result: xr.Dataset, store_attrs: dict, **params) -> xr.Dataset:
    """Attach the store's provenance and the analysis parameters (``analysis_`` prefix)."""
    result.attrs = {**json_attrs(store_attrs), **result.attrs,
                    **{f"analysis_{k}": v for k, v in json_attrs(params).items()}}
    return result


# the parameters (and the result) every analysis documents alike, worded once: see shared_docs
DOCS = {
    "ds": """ds : xarray.Dataset
    An opened attngeom store (dense or compact), or a measurement of ``attngeom.measure``.""",
    "layers": """layers : str or list of int, optional
    Only these layers (the range syntax, e.g. ``"0:4,7"``); default all.""",
    "progress": """progress : bool
    Show a progress bar.""",
    "block_elements": """block_elements : int
    Cells read per block of the one pass over the store (memory against speed).""",
    "returns": """Returns
-------
xarray.Dataset
    The variables listed in the module docstring, provenance in ``attrs``.""",
}
_MARK = re.compile(r"(\s*)\{(\w+(?:, \w+)*)\}\s*")


def shared_docs(func):
    """Fill each docstring line ``{name, ...}`` of ``func`` with the ``DOCS`` entries it names,
    indented as that line (an unknown name fails at import)."""
    lines = []
    for line in (func.__doc__ or "").splitlines():
        mark = _MARK.fullmatch(line)
        if not mark:
            lines.append(line)
            continue
        indent, names = mark.groups()
        lines += [indent + row if row else row
                  for name in names.split(", ") for row in DOCS[name].splitlines()]
    func.__doc__ = "\n".join(lines)
    return func
