"""The same inputs give the same files: every artifact rebuilt and compared with its golden copy.

``tests/golden/data/*.nc`` were made by ``build.py`` at commit 09066ea (a refactor must not
change any number). Here the artifacts are rebuilt through the current command line and compared
variable by variable: integers, strings and NaN patterns exactly, floats to ``RTOL`` (bitwise
equal on the machine that made the golden files, and on an AMD EPYC too with torch's AVX2
kernels, see :func:`rebuilt`). The store's content hash must be unchanged too, and the analysis'
``summary.csv`` is compared column by column to the tolerances of the variables it reports.

Every variable a golden file holds is compared; one that only the rebuilt artifact holds (a new
output the golden files predate) is listed in a :class:`NewInGolden` warning, not failed.
"""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build  # noqa: E402

# GOLDEN_EXACT=1: bitwise (same machine and thread count as the golden files)
RTOL, ATOL = (0.0, 0.0) if os.environ.get("GOLDEN_EXACT") == "1" else (1e-6, 1e-7)
# per artifact: variables whose values are allowed to move by more, as (rtol, atol), in both modes.
# faithfulness: the golden perplexities come from attention in float64, the rebuilt ones from
# attention in float32, so they move by float32 rounding (4e-7 relative at most here; a different
# removal set would move them by far more); their differences (delta_ppl, aopc) by up to 7e-5
# absolute.
# analysis mixed_se / mixed_p_value: the golden files hold statsmodels MixedLM's BFGS answer,
# which stops within its gradient tolerance of the REML optimum (rel. error up to ~2e-5
# measured); the balanced fit gives the exact optimum (tests/analysis/test_analysis_mixed.py
# checks it against MixedLM run to gtol=1e-12), so these move by up to 1e-4 relative.
# analysis lowess / pooled_lowess: LOWESS's robustness pass interpolates within
# 0.01 x range(x) (statsmodels' delta); stated tolerance 0.5 % of a curve's range (1.2e-3
# absolute measured here, on curves spanning 0.56-2.18).
_PPL, _DELTA, _PROBE, _MIXED = (1e-6, 0.0), (1e-6, 1e-4), (1e-6, 1e-7), (1e-4, 0.0)
_LOWESS = (0.0, 0.005 * 1.6)
LOOSER: dict[str, dict[str, tuple[float, float]]] = {
    "faithfulness": {
        "ppl": _PPL, "clean_ppl": _PPL, "drift_ppl": _PPL, "delta_ppl": _DELTA, "aopc": _DELTA,
        "drift_delta_ppl": _DELTA, **{f"drift_{v}_{phase}": _PROBE for phase in ("before", "after")
                                      for v in ("cosine_low", "cosine_all", "output_norm_low")}},
    "analysis": {**{f"anti_alignment.{p}mixed_{v}": _MIXED
                    for p in ("", "residual_") for v in ("se", "p_value")},
                 "convexity.lowess": _LOWESS, "convexity.pooled_lowess": _LOWESS}}


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    """The flattened artifacts rebuilt by ``build.py`` in a child process (their folder).

    torch picks its vectorised CPU kernels by what the CPU offers; the golden files were made
    with the AVX2 ones, and AVX-512's round float32 sums in another order (on an AMD EPYC:
    cosines 4 ulp apart, the convexity fit's CIs 1.5e-4 of their scale). The child runs the
    AVX2 kernels on any x86-64 machine (``ATEN_CPU_CAPABILITY``, read when torch loads).
    """
    out = tmp_path_factory.mktemp("golden")
    env = dict(os.environ)
    if platform.machine().lower() in ("x86_64", "amd64"):
        env.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    run = subprocess.run([sys.executable, str(HERE / "build.py"), str(out)], env=env,
                         capture_output=True, text=True)
    if run.returncode:
        pytest.fail(f"build.py exited {run.returncode}:\n{run.stderr[-4000:]}")
    return out / "flat"


def _golden(name: str):
    import xarray as xr

    with xr.open_dataset(HERE / "data" / f"{name}.nc", engine="h5netcdf") as f:
        return f.load()


class NewInGolden(UserWarning):
    """Variables or summary columns of a rebuilt artifact that its golden file does not hold."""


def _close(x: np.ndarray, y: np.ndarray, tol: tuple[float, float]) -> str | None:
    """Why float arrays ``x`` (rebuilt) and ``y`` (golden) differ, or None (same)."""
    x, y = x.astype(float), y.astype(float)
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return "NaN pattern differs"
    ok = ~np.isnan(y)
    if not np.allclose(x[ok], y[ok], rtol=tol[0], atol=tol[1], equal_nan=False):
        return f"values differ (max abs {np.max(np.abs(x[ok] - y[ok])):.3g})"
    return None


def _tolerance(name: str, var: str) -> tuple[float, float]:
    return LOOSER.get(name, {}).get(var, (RTOL, ATOL))


def _column_tolerance(name: str, column: str, variables) -> tuple[float, float]:
    """The tolerance of the variable (``<file>.<column>``) a summary column reports."""
    found = (str(v) for v in sorted(variables) if str(v).split(".", 1)[-1] == column)
    return _tolerance(name, next(found, column))


def compare_summary(name: str, got: str, want: str, variables) -> tuple[list[str], list[str]]:
    """(differences, new columns) between two ``summary.csv`` texts: every golden column, its
    numbers to the tolerance of the variable it reports, its text exactly."""
    import pandas as pd

    a, b = pd.read_csv(io.StringIO(got)), pd.read_csv(io.StringIO(want))
    new = [f"{name}.summary_csv.{c}" for c in a.columns if c not in b.columns]
    problems = [f"{name}.summary_csv: column {c} missing" for c in b.columns if c not in a.columns]
    if len(a) != len(b):
        return problems + [f"{name}.summary_csv: {len(a)} rows != golden {len(b)}"], new
    for column in (c for c in b.columns if c in a.columns):
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if x.dtype.kind in "fiu" and y.dtype.kind in "fiu":
            why = _close(x, y, _column_tolerance(name, column, variables))
        else:
            why = None if np.array_equal(x.astype(str), y.astype(str)) else "values differ"
        if why:
            problems.append(f"{name}.summary_csv.{column}: {why}")
    return problems, new


def compare(name: str, got, want) -> tuple[list[str], list[str]]:
    """(differences, new variables) between two flattened artifacts, one line each: every
    variable of the golden one (``want``) is compared; the rebuilt one's extra ones are new."""
    problems = [f"{name}: variable {v} missing"
                for v in sorted(set(want.variables) - set(got.variables))]
    new = [f"{name}.{v}" for v in sorted(set(got.variables) - set(want.variables))]
    for var in sorted(set(got.variables) & set(want.variables)):
        a, b = got[var], want[var]
        if a.dims != b.dims or a.shape != b.shape:
            problems.append(f"{name}.{var}: dims {a.dims}{a.shape} != golden {b.dims}{b.shape}")
            continue
        x, y = np.asarray(a.values), np.asarray(b.values)
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            why = _close(x, y, _tolerance(name, var))
            if why:
                problems.append(f"{name}.{var}: {why}")
        elif not np.array_equal(x, y):
            problems.append(f"{name}.{var}: values differ")
    for key in ("config_hash", "shards"):
        if key in want.attrs and got.attrs.get(key) != want.attrs[key]:
            problems.append(f"{name}: attribute {key} differs")
    if "summary_csv" in want.attrs:
        more, cols = compare_summary(name, str(got.attrs.get("summary_csv", "")),
                                     want.attrs["summary_csv"], want.variables)
        problems, new = problems + more, new + cols
    return problems, new


@pytest.mark.parametrize("name", build.ARTIFACTS)
def test_same_as_golden(rebuilt, name):
    import xarray as xr

    with xr.open_dataset(rebuilt / f"{name}.nc", engine="h5netcdf") as f:
        got = f.load()
    problems, new = compare(name, got, _golden(name))
    if new:
        print(f"not in the golden file, not compared: {', '.join(new)}")
        warnings.warn(NewInGolden(f"not in the golden file, not compared: {', '.join(new)}"))
    assert problems == []


def test_compare_detects_a_change():
    """The comparison is not vacuous: one changed value, one dropped variable are reported, and
    a variable only the rebuilt artifact holds is listed, not failed."""
    want = _golden("compact")
    got = want.copy(deep=True)
    got["alpha"].values[0, 0, 0, 1, 0] += 1e-3
    got = got.drop_vars("middle_count")
    got["brand_new"] = got["length"] * 2
    problems, new = compare("compact", got, want)
    assert any("alpha" in p for p in problems) and any("middle_count" in p for p in problems)
    assert new == ["compact.brand_new"] and not any("brand_new" in p for p in problems)
    assert compare("compact", want.copy(deep=True), want) == ([], [])


def test_compare_detects_a_summary_change():
    """summary.csv: a number moved beyond its tolerance, a changed word and a dropped column are
    reported; a number within its variable's looser tolerance is not; a new column is listed."""
    want = _golden("analysis")
    text = want.attrs["summary_csv"]
    assert compare_summary("analysis", text, text, want.variables) == ([], [])
    import pandas as pd

    table = pd.read_csv(io.StringIO(text))
    moved = table.copy()
    moved.loc[0, "sink_rate_mean"] *= 1 + 1e-4                         # default tolerance 1e-6
    moved.loc[0, "mixed_p_value"] *= 1 + 5e-5                          # its variable's: 1e-4
    moved.loc[0, "verdict"] = "other words"
    moved = moved.drop(columns="pooled_vertex").assign(brand_new=1.0)
    problems, new = compare_summary("analysis", moved.to_csv(index=False), text, want.variables)
    assert sorted(p.split(":")[0] for p in problems) == [
        "analysis.summary_csv", "analysis.summary_csv.sink_rate_mean",
        "analysis.summary_csv.verdict"], problems
    assert "pooled_vertex" in " ".join(problems) and new == ["analysis.summary_csv.brand_new"]
