"""The same inputs give the same files: every artifact rebuilt and compared with its golden copy.

``tests/golden/data/*.nc`` were made by ``build.py --write`` (the commit that last regenerated
them says why). Here the stores and the faithfulness result are rebuilt through the current
command line, on whatever CPU and kernels this machine has, and the analysis is rebuilt from the
committed golden store ``data/store``, so that its differences come from the analysis alone.
Every variable is compared: integers, strings and NaN patterns exactly, floats within the
rounding bounds of ``tests/tolerance.py`` (golden and rebuilt values are both within a bound of
the exact value, so ``vs=F32``):

- store measurements: their float32 chain's bound (``store_helpers.measurement_bounds``), with
  the sizes of the golden dense store's values;
- faithfulness: perplexities within ``FAITHFULNESS_PPL``, their differences (delta_ppl, aopc)
  within the sum of their terms' bounds, the drift probes' cosines and norms like the store's;
- analysis (float64, of one and the same store): ``ANALYSIS_FLOAT64`` of each variable's scale,
  MixedLM's optimizer ``MIXEDLM_OPTIMIZER`` and LOWESS's interpolation ``LOWESS_DELTA``.

The store's content hash must be unchanged too, and the analysis' ``summary.csv`` is compared
column by column to the bounds of the variables it reports. A variable or column only the
rebuilt artifact holds fails the test: a new output means the golden files must be regenerated.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build  # noqa: E402
import reference as ref  # noqa: E402
import tiny_models as tm  # noqa: E402
import tolerance as tol  # noqa: E402
from store_helpers import compact_bounds, measurement_bounds, model_dims  # noqa: E402

REGENERATE = ("regenerate the golden files with `python tests/golden/build.py --write` if the "
              "change is intended, and say why in the commit")
MIXED = {f"anti_alignment.{p}mixed_{v}" for p in ("", "residual_") for v in ("se", "p_value")}
LOWESS = {"convexity.lowess", "convexity.pooled_lowess"}


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    """The flattened artifacts rebuilt by ``build.py`` in a child process (their folder)."""
    out = tmp_path_factory.mktemp("golden")
    run = subprocess.run([sys.executable, str(HERE / "build.py"), str(out)],
                         capture_output=True, text=True)
    if run.returncode:
        pytest.fail(f"build.py exited {run.returncode}:\n{run.stderr[-4000:]}")
    return out / "flat"


def _golden(name: str):
    import xarray as xr

    with xr.open_dataset(HERE / "data" / f"{name}.nc", engine="h5netcdf") as f:
        return f.load()


def _store_bounds(want) -> dict[str, np.ndarray]:
    """Absolute bounds of a flattened store's float32 measurements (golden and rebuilt).

    Sizes come from the golden dense store (every pair of the tiny llama's texts); a compact
    store's rows, layers and heads are picked from it by ``text_index`` and the coordinates.
    Its residual (the non-sink part) depends on sink_k: those two take the compact store's own.
    """
    dense = _golden("dense")
    r = {n: dense[n].values.astype(float) for n in ref.NAMES if n in dense}
    dims = model_dims(tm.make_config("llama"))
    if "lag" not in want.dims:
        return measurement_bounds(r, dims, vs=tol.F32)
    bounds = compact_bounds(r, dims, want.sizes["sink"], want.sizes["lag"], vs=tol.F32)
    rows, layers, heads = (want[c].values for c in ("text_index", "layer", "head"))
    pick = {}
    for name, b in bounds.items():
        b = b[rows][:, layers]
        pick[name] = b[:, :, heads] if name != "layer_output_norm" else b
    on, rn = (want[n].values.astype(float) for n in ("output_norm", "residual_norm"))
    with np.errstate(invalid="ignore", divide="ignore"):
        gamma = pick["output_norm"] / np.abs(on)                    # gamma(N) per cell
        pick["residual_norm"] = gamma * np.abs(rn)
        pick["sink_residual_cosine"] = 2 * gamma * np.fmax(1.0, on / rn)
    return pick


def _faithfulness_bounds(want) -> dict[str, tol.Tol]:
    """Perplexities: the measured spread; a difference of two: the sum of their bounds."""
    r = tol.FAITHFULNESS_PPL.rtol
    ppl, clean = np.abs(want["ppl"]), np.abs(want["clean_ppl"])
    out = {n: tol.FAITHFULNESS_PPL for n in ("ppl", "clean_ppl", "drift_ppl")}
    out["delta_ppl"] = tol.Tol(atol=(r * (ppl + clean)).transpose(*want["delta_ppl"].dims).values)
    out["aopc"] = tol.Tol(atol=(r * (ppl + clean)).mean("fraction").transpose(
        *want["aopc"].dims).values)
    out["drift_delta_ppl"] = tol.Tol(atol=r * (np.abs(want["drift_ppl"]) + clean).values)
    T, dims = int(want["length"].max()), model_dims(tm.make_config("llama"))
    gamma = np.array([tol.dot(tol.attention_terms(T=T, layer=layer, **dims), vs=tol.F32).atol
                      for layer in want["layer"].values])          # per layer, (sequence, layer)
    for phase in ("before", "after"):                               # means of cosines, norms
        for v in ("cosine_low", "cosine_all"):
            out[f"drift_{v}_{phase}"] = tol.Tol(atol=2 * gamma)
        out[f"drift_output_norm_low_{phase}"] = tol.Tol(rtol=gamma)
    return out


def _analysis_bound(var: str, want) -> tol.Tol:
    """A float64 analysis variable's bound, scaled by its largest |value| (LOWESS: its range);
    an interval's end adds its quantile's error, scaled by the largest half-width."""
    x = np.asarray(want[var].values, dtype=float)
    if var in LOWESS:
        return tol.LOWESS_DELTA * float(np.nanmax(x) - np.nanmin(x))
    if var in MIXED:
        return tol.MIXEDLM_OPTIMIZER
    bound = tol.ANALYSIS_FLOAT64 * float(np.nanmax(np.abs(x), initial=0.0))
    if var.endswith(("_ci_low", "_ci_high")):
        stem = var.rsplit("_", 1)[0]
        half = np.abs(want[f"{stem}_high"].values - want[f"{stem}_low"].values) / 2
        bound += tol.Tol(atol=tol.QUANTILE.rtol * float(np.nanmax(half, initial=0.0)))
    return bound


def bounds(name: str, want) -> dict[str, tol.Tol]:
    """Every float variable of the golden artifact ``want`` -> its bound."""
    floats = [str(v) for v in want.variables if want[v].dtype.kind == "f"]
    if name == "analysis":
        return {v: _analysis_bound(v, want) for v in floats}
    if name == "faithfulness":
        found = _faithfulness_bounds(want)
        return {v: found.get(v, tol.Tol()) for v in floats}       # fraction: a coordinate
    found = _store_bounds(want)
    return {v: tol.Tol(atol=found[v]) if v in found else tol.Tol() for v in floats}


def _close(x: np.ndarray, y: np.ndarray, bound: tol.Tol, name: str) -> str | None:
    """Why float arrays ``x`` (rebuilt) and ``y`` (golden) differ, or None (same)."""
    try:
        tol.assert_close(x, y, bound, name)
    except AssertionError as err:
        return str(err).split(": ", 1)[-1].split(": got")[0]
    return None


def _column_bound(column: str, found: dict[str, tol.Tol]) -> tol.Tol:
    """The bound of the variable (``<file>.<column>``) a summary column reports."""
    match = [v for v in sorted(found) if v.split(".", 1)[-1] == column]
    return found[match[0]] if match else tol.Tol()


def compare_summary(name: str, got: str, want: str, found: dict[str, tol.Tol]) -> list[str]:
    """The differences between two ``summary.csv`` texts: every column, its numbers within the
    bound of the variable it reports, its text exactly; a new column too."""
    import pandas as pd

    a, b = pd.read_csv(io.StringIO(got)), pd.read_csv(io.StringIO(want))
    problems = [f"{name}.summary_csv: column {c} missing" for c in b.columns if c not in a.columns]
    problems += [f"{name}.summary_csv: column {c} not in the golden file; {REGENERATE}"
                 for c in a.columns if c not in b.columns]
    if len(a) != len(b):
        return problems + [f"{name}.summary_csv: {len(a)} rows != golden {len(b)}"]
    for column in (c for c in b.columns if c in a.columns):
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if x.dtype.kind in "fiu" and y.dtype.kind in "fiu":
            why = _close(x, y, _column_bound(column, found), f"{name}.summary_csv.{column}")
        else:
            why = None if np.array_equal(x.astype(str), y.astype(str)) else "values differ"
        if why:
            problems.append(f"{name}.summary_csv.{column}: {why}")
    return problems


def compare(name: str, got, want) -> list[str]:
    """The differences between two flattened artifacts, one line each: every variable of
    either; one only the rebuilt artifact (``got``) holds says to regenerate."""
    problems = [f"{name}: variable {v} missing"
                for v in sorted(set(want.variables) - set(got.variables))]
    problems += [f"{name}: variable {v} not in the golden file; {REGENERATE}"
                 for v in sorted(set(got.variables) - set(want.variables))]
    found = bounds(name, want)
    for var in sorted(set(got.variables) & set(want.variables)):
        a, b = got[var], want[var]
        if a.dims != b.dims or a.shape != b.shape:
            problems.append(f"{name}.{var}: dims {a.dims}{a.shape} != golden {b.dims}{b.shape}")
            continue
        x, y = np.asarray(a.values), np.asarray(b.values)
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            why = _close(x, y, found.get(str(var), tol.Tol()), f"golden {name}.{var}")
            if why:
                problems.append(f"{name}.{var}: {why}")
        elif not np.array_equal(x, y):
            problems.append(f"{name}.{var}: values differ")
    for key in ("config_hash", "shards"):
        if key in want.attrs and got.attrs.get(key) != want.attrs[key]:
            problems.append(f"{name}: attribute {key} differs")
    if "summary_csv" in want.attrs:
        problems += compare_summary(name, str(got.attrs.get("summary_csv", "")),
                                    want.attrs["summary_csv"], found)
    return problems


@pytest.mark.parametrize("name", build.ARTIFACTS)
def test_same_as_golden(rebuilt, name):
    import xarray as xr

    with xr.open_dataset(rebuilt / f"{name}.nc", engine="h5netcdf") as f:
        got = f.load()
    assert compare(name, got, _golden(name)) == []


def test_compare_detects_a_change(monkeypatch):
    """The comparison is not vacuous: a value moved by a few of its bounds, one dropped variable
    and one only the rebuilt artifact holds are all reported; the golden file equals itself."""
    monkeypatch.delenv("TOLERANCE_LOG", raising=False)        # not a measured spread
    want = _golden("compact")
    bound = float(_store_bounds(want)["alpha"][0, 0, 0, 1, 0])
    got = want.copy(deep=True)
    got["alpha"].values[0, 0, 0, 1, 0] += 3 * bound
    got = got.drop_vars("middle_count")
    got["brand_new"] = got["length"] * 2
    problems = compare("compact", got, want)
    assert len(problems) == 3, problems
    assert "alpha" in problems[-1] and "middle_count" in problems[0]
    assert "brand_new" in problems[1] and "build.py --write" in problems[1]
    assert compare("compact", want.copy(deep=True), want) == []


def test_compare_detects_a_summary_change(monkeypatch):
    """summary.csv: a number moved beyond its bound, a changed word, a dropped and a new
    column are reported; a number within its variable's looser bound is not."""
    import pandas as pd

    monkeypatch.delenv("TOLERANCE_LOG", raising=False)        # not a measured spread
    want = _golden("analysis")
    text = want.attrs["summary_csv"]
    found = bounds("analysis", want)
    assert compare_summary("analysis", text, text, found) == []
    table = pd.read_csv(io.StringIO(text))
    moved = table.copy()
    moved.loc[0, "sink_rate_mean"] *= 1 + 1e-6                        # ANALYSIS_FLOAT64: 1e-9
    moved.loc[0, "mixed_p_value"] *= 1 + tol.MIXEDLM_OPTIMIZER.rtol / 2
    moved.loc[0, "verdict"] = "other words"
    moved = moved.drop(columns="pooled_vertex").assign(brand_new=1.0)
    problems = compare_summary("analysis", moved.to_csv(index=False), text, found)
    assert sorted(p.split(":")[0] for p in problems) == [
        "analysis.summary_csv", "analysis.summary_csv", "analysis.summary_csv.sink_rate_mean",
        "analysis.summary_csv.verdict"], problems
    joined = " ".join(problems)
    assert "pooled_vertex" in joined and "brand_new" in joined
