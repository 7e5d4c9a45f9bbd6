"""attngeom view without a browser: what the page embeds, its size limit, Jupyter, the CLI.

The embedded arrays are decoded and compared cell by cell with the shards read by plain
xarray (tests/reports/view_reference.py); contributions there come from the formula, not from
attngeom. tests/reports/test_view_browser.py checks what a browser shows.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tolerance as tol
import view_reference as R
from attngeom.cli import main
from attngeom.reports.view import data as V
from attngeom.reports.view import view


@pytest.fixture
def compact(compact_view_data):
    return compact_view_data


def decoded(page_html: str) -> tuple[dict, list[dict]]:
    meta, blobs = R.page_parts(page_html)
    return meta, [V.decode(s["index"], base64.b64decode(b))
                  for s, b in zip(meta["sequences"], blobs)]


def check(got: np.ndarray, want: np.ndarray, name: str) -> None:
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN pattern differs"
    ok = ~np.isnan(want)
    # float16 on the page; the view's and this formula's few float32 / float64 roundings
    np.testing.assert_allclose(got[ok], want[ok], err_msg=name,
                               **(tol.rounded(tol.F16) + tol.relative(4, vs=tol.F64)))


def test_compact_page_holds_the_store_numbers(compact):
    path, ds, raw = compact
    meta, arrays = decoded(view(path).html)
    assert meta["mode"] == "compact" and meta["sink_k"] == 2 and meta["tail_w"] == 3
    d4 = R.PAIR_DIMS
    for s, (entry, got) in enumerate(zip(meta["sequences"], arrays)):
        n = int(raw["length"].values[s])
        assert entry["length"] == n and entry["raw"] == [str(t) for t in raw["token"].values[s, :n]]
        vn = R.arr(raw, "value_norm", ("sequence", "layer", "head", "key"))[s][..., :n]
        on = R.arr(raw, "output_norm", d4)[s][..., :n]
        lon = R.arr(raw, "layer_output_norm", ("sequence", "layer", "query"))[s][:, :n]
        check(got["value_norm"], vn, "value_norm")
        for prefix, dim in (("", "sink"), ("tail_", "lag")):
            a = R.arr(raw, prefix + "alpha", d4 + (dim,))[s][:, :, :n]
            cos = R.arr(raw, prefix + "cosine", d4 + (dim,))[s][:, :, :n]
            cl = R.arr(raw, prefix + "cosine_layer", d4 + (dim,))[s][:, :, :n]
            key = np.arange(2)[None, :] if dim == "sink" else \
                np.clip(np.arange(n)[:, None] - np.arange(3)[None, :], 0, None)
            v = vn[:, :, key] if dim == "lag" else vn[:, :, None, :2]       # (L, H, n, slot)
            check(got[prefix + "alpha"], a, prefix + "alpha")
            check(got[prefix + "cosine"], cos, prefix + "cosine")
            check(got[prefix + "contribution"], a * v * cos / on[..., None], prefix + "c")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)          # all-NaN: NaN
                check(got[f"total:{prefix}alpha"], np.nanmean(a, 1), "total alpha")
            c_layer = a * v * cl / lon[:, None, :, None]
            total = np.where(np.isfinite(c_layer).any(1), np.nansum(c_layer, 1), np.nan)
            check(got[f"total:{prefix}contribution"], total, "total contribution")
        for name in ("middle_alpha", "middle_contribution", "middle_count"):
            check(got[name], R.arr(raw, name, d4)[s][..., :n], name)
    k = 2
    for name in ("sink_rate", "sink_contribution", "sink_contribution_layer"):
        want = R.sink_map(raw, name, k)
        got = np.array(meta["maps"]["per_sequence"][name], dtype=float).reshape(want.shape)
        # means over T queries of float32 values, sent with 4 significant digits
        np.testing.assert_allclose(got, want, err_msg=name, **(tol.digits(4) + tol.relative(
            raw.sizes["query"] + 4, vs=tol.F64)))


def test_pooled_map_is_token_pooled(compact):
    """Pooled over sequences: the mean over all valid queries (not the mean of means)."""
    _, ds, raw = compact
    meta, _ = decoded(view(ds, sequences="1:4").html)
    a = R.arr(raw, "alpha", R.PAIR_DIMS + ("sink",))[1:4, ..., 0]                 # (3, L, H, Q)
    q = np.arange(a.shape[-1])
    ok = (q >= 2) & (q < raw["length"].values[1:4, None, None, None])
    want = np.where(ok, a, 0).sum((0, 3)) / ok.sum((0, 3))
    got = np.array(meta["maps"]["pooled"]["sink_rate"], dtype=float).reshape(want.shape)
    # a mean of nonnegative float32 values over ok.sum() queries, sent with 4 digits
    np.testing.assert_allclose(got, want, **(tol.digits(4) + tol.relative(
        int(ok.sum((0, 3)).max()) + 4, vs=tol.F64)))
    assert [s["label"] for s in meta["sequences"]] == [1, 2, 3]


def test_dense_page_holds_every_pair(dense_view_data):
    _, ds, raw = dense_view_data
    meta, arrays = decoded(view(ds, layers="1", heads="0:2").html)
    assert meta["layers"] == [1] and meta["heads"] == [0, 1]
    d5 = R.PAIR_DIMS + ("key",)
    for s, got in enumerate(arrays):
        n = int(raw["length"].values[s])
        a = R.arr(raw, "alpha", d5)[s, 1:2, :2, :n, :n]
        vn = R.arr(raw, "value_norm", ("sequence", "layer", "head", "key"))[s, 1:2, :2, :n]
        on = R.arr(raw, "output_norm", R.PAIR_DIMS)[s, 1:2, :2, :n]
        cos = R.arr(raw, "cosine", d5)[s, 1:2, :2, :n, :n]
        check(got["alpha"], a, "alpha")
        check(got["contribution"], a * vn[:, :, None, :] * cos / on[..., None], "contribution")
        assert np.isnan(got["alpha"][0, 0][np.triu_indices(n, 1)]).all()        # causal mask


def test_values_beyond_float16_travel_as_float32():
    big = np.array([[1.5e6, -3.0, np.nan], [70000.0, 2.0 ** -20, 0.0]])
    small = np.array([0.1234567, 2.0 ** -20, np.nan])
    count = np.array([0.0, 4095.0, np.nan])
    index, data = V.encode({"value_norm": big, "alpha": small, "middle_count": count})
    out = V.decode(index, data)
    assert [e["dtype"] for e in index] == ["f32", "f16", "u16"]
    np.testing.assert_allclose(out["value_norm"], big, **tol.rounded(tol.F32))
    np.testing.assert_allclose(out["alpha"], small, **tol.rounded(tol.F16))
    np.testing.assert_array_equal(out["middle_count"], count)


def test_size_limit_names_a_selection_that_fits(compact, tmp_path, capsys):
    path, ds, _ = compact
    full = view(ds).nbytes
    limit = (full + view(ds, sequences="0").nbytes) // 2
    with pytest.raises(ValueError, match=r"max_bytes=") as err:
        view(ds, max_bytes=limit)
    fit = re.search(r"sequences='([0-9:,]+)'", str(err.value)).group(1)
    assert view(ds, sequences=fit, max_bytes=limit).nbytes <= limit
    out = tmp_path / "big.html"
    assert main(["view", str(path), "--out", str(out), "--max-bytes", str(limit)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "--max-bytes" in line and "--sequences 0:" in line
    assert not out.exists()


def test_cli_writes_the_page_and_rejects_bad_selections(compact, tmp_path, capsys):
    path, ds, _ = compact
    out = tmp_path / "v.html"
    assert main(["view", str(path), "--out", str(out), "--layers", "0",
                 "--sequences", "2:4", "--sequence", "3"]) == 0
    meta, _ = R.page_parts(out.read_text(encoding="utf-8"))
    assert meta["layers"] == [0] and meta["initial"]["sequence"] == 1
    assert "wrote" in capsys.readouterr().out
    assert main(["view", str(path), "--out", str(tmp_path / "x.html"), "--layers", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--layers 99" in err and "\n" not in err
    with pytest.raises(ValueError, match="sequence 7 is not among"):
        view(ds, sequence=7, sequences="0:2")


def test_jupyter_repr_is_the_page_and_self_contained(compact, tmp_path):
    page = view(compact[1], sequence=1)
    fragment = page._repr_html_()
    assert fragment == page.fragment and fragment in page.html
    saved = page.save(tmp_path / "v.html").read_text(encoding="utf-8")
    assert saved == page.html
    lowered = fragment.lower()
    for outside in ("<link", " src=", "href=", "fetch(", "import(", "xmlhttprequest", "@import"):
        assert outside not in lowered, outside
    urls = set(re.findall(r"https?://[^\s\"'<>]+", fragment))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls                # an XML namespace only


def test_import_attngeom_view_loads_no_torch(text_compact_store):
    code = ("import sys, attngeom; page = attngeom.view(sys.argv[1], sequence=0); "
            "print(len(page.html), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(text_compact_store)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    size, torch = out.stdout.split()
    assert int(size) > 1000 and torch == "False"
