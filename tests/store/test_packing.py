"""``--precision packed`` (store/format/packing.py) against float32 stores of the same inputs.

The quantisation error of every packed variable is checked against the float32 store of the
same model, texts and options (at most half a step plus float32 rounding), the derived
contributions against the bound that follows from the steps and the stored norms, the int16
chunks against HDF5's own encoding, and the decoding by plain xarray and by h5py's raw values
with the CF formula. A tiny gemma3 (layer 0 sliding window 4, layer 1 full attention) makes
``middle_count`` differ between layers; it does not differ between heads, and packed stores keep
it once per layer.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import textwrap

import h5py
import numpy as np
import pytest
import xarray as xr

import attngeom.store
import tiny_models as tm
import tolerance as tol
from attngeom.store.format import schema as S
from attngeom.store.format.chunks import ChunkEncoder, encode_chunk
from attngeom.store.format.packing import (BITROUND_ATTR, COSINE, FILL, KEEP_BITS, NORM_ERROR,
                                    PACKED_VARIABLES, PROBABILITY, ROUNDED_VARIABLES, bitround,
                                    contribution_bound, once_per_head, pack, packing_problem,
                                    stored_dataset)
from attngeom.store.format.shards import encoding, write_shard
from attngeom.store.io.writer import write_netcdf
from store_helpers import write_texts

OPTIONS = ["--max-length", 12, "--sink-k", 1, "--tail-w", 3, "--shard-size", 3,
           "--batch-size", 2, "--quiet"]
DERIVED = {  # derived name -> (alpha, cosine, norm) it is made of; value_norm gathered as stored
    "contribution": ("alpha", "cosine", "output_norm"),
    "contribution_layer": ("alpha", "cosine_layer", "layer_output_norm"),
    "tail_contribution": ("tail_alpha", "tail_cosine", "output_norm"),
    "tail_contribution_layer": ("tail_alpha", "tail_cosine_layer", "layer_output_norm"),
}


def _cli(*args) -> None:
    from attngeom.cli import main

    assert main([str(a) for a in args]) == 0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Compact float32 and packed stores (gemma3) and dense ones (llama), same inputs."""
    root = tmp_path_factory.mktemp("packing")
    texts = write_texts(root / "texts.jsonl", (3, 12, 6, 1, 11, 8))
    out = {}
    for arch, mode in (("gemma3", "compact"), ("llama", "dense")):
        model = tm.save_tiny(arch, root / f"model-{arch}")
        for precision in ("float32", "packed"):
            path = root / f"{arch}-{mode}-{precision}"
            _cli("extract", "--model", model, "--data", texts, "--mode", mode,
                 "--precision", precision, "--out", path, *OPTIONS)
            out[mode, precision] = path
    return out


@pytest.fixture(scope="module")
def opened(pair):
    return {key: attngeom.store.open(path).load() for key, path in pair.items()}


# ------------------------------------------------------------------ the quantiser alone
def _decoded_by_xarray(name: str, q: np.ndarray) -> np.ndarray:
    """int16 written with the CF attributes by h5py alone, decoded by xarray's mask_and_scale."""
    p = PACKED_VARIABLES[name]
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        d = f.create_dataset("x", data=q)
        d.attrs["scale_factor"] = np.float32(p.scale_factor)
        d.attrs["add_offset"] = np.float32(p.add_offset)
        d.attrs["_FillValue"] = np.int16(FILL)
    buf.seek(0)
    with xr.open_dataset(buf, engine="h5netcdf", phony_dims="sort") as ds:
        return ds["x"].values


@pytest.mark.parametrize("name", ["alpha", "cosine"])
def test_quantisation_error_is_half_a_step(name):
    p = PACKED_VARIABLES[name]
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(p.low, p.high, 200_000),
                        [p.low, p.high, p.low - 1e-7, p.high + 1e-7, (p.low + p.high) / 2]])
    x = x.astype(np.float32)
    got = _decoded_by_xarray(name, pack(name, x))
    assert got.dtype == np.float32
    err = np.abs(got.astype(np.float64) - np.clip(x.astype(np.float64), p.low, p.high))
    step = (p.high - p.low) / (2 * p.qmax)
    assert err.max() <= p.max_error
    assert err.max() > 0.99 * step / 2            # the stated bound is the real one
    assert got[-5] == p.low and got[-4] == p.high   # ends exact; roundoff beyond them clipped
    assert got[-3] == p.low and got[-2] == p.high


def test_quantisation_steps_are_stated():
    # the documented steps, to the 1-2 % their rounding in the docs allows (not rounding error)
    assert PROBABILITY.max_error == pytest.approx(0.5 / 65534, rel=0.02)
    assert COSINE.max_error == pytest.approx(0.5 / 16383, rel=0.01)
    assert float(PROBABILITY.add_offset) == 0.5 and float(COSINE.add_offset) == 0.0
    assert NORM_ERROR == 2.0 ** -15 and KEEP_BITS == 14


def test_bitround_is_round_to_nearest_even_of_the_mantissa():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(300_000) * np.exp(rng.uniform(-30, 30, 300_000))).astype(np.float32)
    x[:4] = [1 + 2.0 ** -15, 1 + 3 * 2.0 ** -15, -(1 + 2.0 ** -15), 2.0 ** -130]  # ties, subnormal
    got = bitround(x)
    m, e = np.frexp(x.astype(np.float64))                    # x = m 2**e, 0.5 <= |m| < 1
    want = np.ldexp(np.rint(m * 2.0 ** (KEEP_BITS + 1)), e - KEEP_BITS - 1)
    normal = np.abs(x) >= np.finfo(np.float32).tiny
    np.testing.assert_array_equal(got[normal], want[normal].astype(np.float32))
    assert list(got[:3]) == [1.0, 1 + 4 * 2.0 ** -15, -1.0]        # ties go to the even one
    rel = np.abs(got[normal].astype(np.float64) - x[normal]) / np.abs(x[normal])
    assert NORM_ERROR * 0.99 < rel.max() <= NORM_ERROR
    np.testing.assert_array_equal(bitround(got), got)             # idempotent: rewrites keep it
    special = np.array([np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(bitround(special), special)


def test_non_finite_values_are_stored_as_nan():
    q = pack("cosine", np.array([np.nan, np.inf, -np.inf, 0.25], dtype=np.float32))
    assert list(q[:3]) == [FILL] * 3
    got = _decoded_by_xarray("cosine", q)
    assert np.isnan(got[:3]).all() and abs(got[3] - 0.25) <= COSINE.max_error


def test_a_variable_that_differs_by_head_is_refused():
    x = np.zeros((2, 3, 4, 5), dtype=np.float32)
    x[..., 2] = np.nan
    assert once_per_head("middle_count", x, 2).shape == (2, 3, 5)
    x[1, 0, 3, 0] = 1.0
    with pytest.raises(ValueError, match="differs between heads.*--precision float32"):
        once_per_head("middle_count", x, 2)


# ------------------------------------------------------------------ chunks outside HDF5
def test_int16_chunk_is_byte_identical_to_hdf5(zlib_deflate):
    rng = np.random.default_rng(1)
    x = pack("alpha", rng.uniform(0, 1, (3, 2, 5, 37)) ** 4)
    x[..., 30:] = FILL
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        d = f.create_dataset("x", data=x, chunks=(3, 1, 5, 37), shuffle=True,
                             compression="gzip", compression_opts=1, fletcher32=True,
                             fillvalue=FILL)
        for layer in range(2):
            assert encode_chunk(x[:, layer:layer + 1]) == d.id.read_direct_chunk(
                (0, layer, 0, 0))[1]


def _float_shard(rng, n=7, T=20) -> xr.Dataset:
    alpha = rng.uniform(0, 1, (n, 2, 3, T, 4)).astype(np.float32)
    alpha[:, :, :, 15:] = np.nan
    cos = rng.uniform(-1, 1, (n, 2, 3, T)).astype(np.float32)
    count = np.broadcast_to(rng.integers(0, 9, (n, 2, 1, T)), (n, 2, 3, T)).astype(np.float32)
    return xr.Dataset(
        {"tail_alpha": (S.TAIL, alpha, {"description": "a"}),
         "sink_residual_cosine": (S.PER_QUERY, cos, {"description": "c"}),
         "head_share": (S.PER_QUERY, cos * 3, {"description": "h"}),
         "middle_count": (S.PER_QUERY, count, {"description": "m"}),
         "length": ((S.SEQUENCE,), np.arange(n, dtype=np.int32))},
        coords={S.SEQUENCE: np.arange(n), S.LAYER: np.arange(2), S.HEAD: np.arange(3),
                S.QUERY: np.arange(T), S.LAG: np.arange(4)})


def test_encoded_packed_shard_equals_the_hdf5_written_one(tmp_path, zlib_deflate):
    """Extraction's path (pack, ChunkEncoder) and the rewrite path (stored_dataset, xarray)
    give the same file contents and the same bytes in every whole chunk."""
    from attngeom.store.format.packing import stored_arrays

    ds = _float_shard(np.random.default_rng(2))
    from attngeom.store.format.packing import stored_attrs

    names = ("tail_alpha", "sink_residual_cosine", "middle_count", "head_share")
    enc = ChunkEncoder(rows=3, during=1, after=2,
                       dims={n: S.dims_for(n, "compact", "packed") for n in names},
                       attrs={n: stored_attrs(n, "packed") for n in names})
    for lo in (0, 3, 6):
        enc.add(stored_arrays({n: ds[n].values[lo:lo + 3] for n in names}, "compact", "packed"))
    packed = stored_dataset(ds, "packed")
    write_shard(packed, tmp_path / "new.nc", enc.finish())
    write_netcdf(packed, tmp_path / "old.nc", encoding(packed, rows=3))
    with xr.open_dataset(tmp_path / "new.nc") as new, xr.open_dataset(tmp_path / "old.nc") as old:
        assert new.identical(old)
        assert new["tail_alpha"].encoding["dtype"] == np.int16
        assert new["middle_count"].dims == S.PER_LAYER_QUERY
        assert new["head_share"].attrs[BITROUND_ATTR] == KEEP_BITS
    with h5py.File(tmp_path / "new.nc") as f, h5py.File(tmp_path / "old.nc") as g:
        for name in names:
            a, b = f[name], g[name]
            assert (a.dtype, a.chunks, a.shuffle, a.fletcher32) == (b.dtype, b.chunks, True, True)
            for i in range(a.id.get_num_chunks()):
                offset = a.id.get_chunk_info(i).chunk_offset
                if offset[0] + 3 <= 7:
                    assert a.id.read_direct_chunk(offset) == b.id.read_direct_chunk(offset)


# ------------------------------------------------------------------ stores of real extraction
@pytest.mark.parametrize("mode", ["compact", "dense"])
def test_shards_hold_int16_that_plain_xarray_decodes(pair, mode):
    names = [n for n in PACKED_VARIABLES if n in S.variables_for(mode)]
    shard = "shards/shard-00000.nc"
    with h5py.File(pair[mode, "packed"] / shard) as f:
        raw = {n: (f[n][()], dict(f[n].attrs)) for n in names}
    with xr.open_dataset(pair[mode, "packed"] / shard, engine="h5netcdf") as packed, \
            xr.open_dataset(pair[mode, "float32"] / shard, engine="h5netcdf") as plain:
        for name in names:
            q, attrs = raw[name]
            p = PACKED_VARIABLES[name]
            assert q.dtype == np.int16 and packing_problem("packed", name, q.dtype, attrs) is None
            offset, scale = (np.ravel(attrs[k])[0] for k in ("add_offset", "scale_factor"))
            cf = np.where(q == FILL, np.nan, offset + scale * q.astype(np.float64))   # CF by hand
            want = plain[name].values.astype(np.float64)
            got = packed[name].values
            assert got.dtype == np.float32, name
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
            ok = ~np.isnan(want)
            assert np.abs(got[ok] - np.clip(want[ok], p.low, p.high)).max() <= p.max_error, name
            # xarray's float32 decoding against float64: one product and one sum, in float32
            np.testing.assert_allclose(got, cf, equal_nan=True, err_msg=name, **tol.dot(
                2, abs(offset) + abs(scale) * np.abs(q).max(), vs=tol.F64))
        for name in ROUNDED_VARIABLES:
            if name in plain:
                got, want = packed[name].values, plain[name].values
                assert got.dtype == np.float32 and packed[name].attrs[BITROUND_ATTR] == KEEP_BITS
                assert (got[np.isfinite(got)].view(np.uint32) & 0x1FF == 0).all(), name
                ok = np.isfinite(want) & (want != 0)
                assert np.abs(got[ok] / want[ok].astype(np.float64) - 1).max() <= NORM_ERROR
        if mode == "compact":
            assert packed["middle_count"].dims == S.PER_LAYER_QUERY
            assert plain["middle_count"].dims == S.PER_QUERY


@pytest.mark.parametrize("mode", ["compact", "dense"])
def test_opened_packed_store_matches_float32_store(opened, mode):
    a, b = opened[mode, "float32"], opened[mode, "packed"]
    assert set(a.data_vars) == set(b.data_vars) and dict(a.sizes) == dict(b.sizes)
    assert a.attrs["precision"] == "float32" and b.attrs["precision"] == "packed"
    for name in a.data_vars:
        x, y = a[name], b[name]
        assert x.dims == y.dims and y.dtype == x.dtype, name
        if x.dtype.kind == "f":
            assert np.array_equal(np.isnan(x.values), np.isnan(y.values)), name
        if name in PACKED_VARIABLES:
            p = PACKED_VARIABLES[name]
            err = np.nanmax(np.abs(y.values - np.clip(x.values, p.low, p.high)))
            assert 0 < err <= p.max_error, (name, err)
        elif name in ROUNDED_VARIABLES:
            nonzero = x.values != 0
            rel = np.abs(y.values[nonzero].astype(np.float64) / x.values[nonzero] - 1)
            assert 0 < np.nanmax(rel) <= NORM_ERROR, name
        elif name not in DERIVED:                     # middle_count, per-sequence: exact
            np.testing.assert_array_equal(y.values, x.values, err_msg=name)
    if mode == "compact":       # middle_count (compared above) differs by layer: layer 0 slides
        assert not np.array_equal(b["middle_count"][:, 0], b["middle_count"][:, 1],
                                  equal_nan=True)


def _per_pair(ds, name: str, like: str) -> np.ndarray:
    """value_norm (gathered at each pair's key) or a norm, broadcast to ``like``'s shape."""
    dims = ds[like].dims
    if name == "value_norm":
        vn = ds["value_norm"].values                                   # (S, L, H, key)
        if S.LAG in dims:
            key = ds[S.QUERY].values[:, None] - ds[S.LAG].values[None]  # (query, lag)
            x = vn[..., np.clip(key, 0, None)]
        else:
            x = vn[..., None, :ds.sizes[dims[-1]]]
    elif name == "output_norm":
        x = ds[name].values[..., None]                                 # (S, L, H, query, 1)
    else:
        x = ds[name].values[:, :, None, :, None]                       # (S, L, 1, query, 1)
    return np.broadcast_to(x, ds[like].shape).astype(np.float64)


@pytest.mark.parametrize("mode", ["compact", "dense"])
def test_derived_contributions_within_the_stated_bound(opened, mode):
    a, b = opened[mode, "float32"], opened[mode, "packed"]
    worst = 0.0
    for name, (alpha, cosine, norm) in DERIVED.items():
        if name not in a:
            continue
        x, y = a[name].values.astype(np.float64), b[name].values.astype(np.float64)
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        bound = contribution_bound(a[alpha].values.astype(np.float64),
                                   _per_pair(a, "value_norm", alpha),
                                   a[cosine].values.astype(np.float64),
                                   _per_pair(a, norm, alpha),
                                   PROBABILITY.max_error, COSINE.max_error, NORM_ERROR)
        ok = np.isfinite(x)
        assert ok.any() and np.isfinite(bound[ok]).all(), name
        assert (np.abs(y - x)[ok] <= bound[ok]).all(), (name, np.max(np.abs(y - x)[ok] / bound[ok]))
        worst = max(worst, float(np.max(np.abs(y - x)[ok] / bound[ok])))
    assert worst > 0.01                                  # the bound is not vacuous


def test_packed_store_validates_and_resumes_only_as_packed(pair, tmp_path):
    from attngeom.store.io.validate import validate

    assert validate(pair["compact", "packed"]) == []
    text = (pair["compact", "packed"] / "README.txt").read_text()
    assert "Precision: packed" in text and "middle_count  (sequence, layer, query)" in text
    assert re.search(r"tail_alpha  \(.*\)  \[.*int16 packed, step 1.53e-05, error <= 7.7", text)
    assert re.search(r"tail_cosine  \(.*\)  \[.*int16 packed, step 6.1e-05, error <= 3.06e-05", text)
    assert re.search(r"value_norm  \(.*\)  \[.*14 mantissa bits, relative error <= 3.05e-05",
                     text)
    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.store.errors import StoreError

    store = shutil.copytree(pair["compact", "packed"], tmp_path / "s")
    sources = json.loads((store / "manifest.json").read_text())["sources"]
    with pytest.raises(StoreError, match="options.precision: 'packed' != None"):
        extract(sources["model"], sources["data"], store,
                ExtractConfig(max_length=12, tail_w=3, shard_size=3), progress=False)


def test_validate_finds_a_float32_variable_in_a_packed_store(pair, tmp_path):
    from attngeom.store.format.manifest import file_sha256
    from attngeom.store.io.validate import check_shard

    manifest = json.loads((pair["compact", "packed"] / "manifest.json").read_text())
    entry = manifest["shards"][0]
    shard = tmp_path / "shard.nc"
    with xr.open_dataset(pair["compact", "float32"] / entry["file"], engine="h5netcdf") as f:
        ds = stored_dataset(f.load(), "packed")
    ds["alpha"] = ds["alpha"].astype(np.float32)           # packed store, float32 alpha
    ds["alpha"].attrs = {}
    ds.attrs["attngeom_config_hash"] = manifest["config_hash"]
    write_shard(ds, shard)
    problems = check_shard(shard, dict(entry, sha256=file_sha256(shard)), manifest)
    assert problems and "alpha" in problems[0] and "not int16" in problems[0]


def test_subset_and_merge_keep_the_packing(pair, opened, tmp_path):
    from attngeom.store.ops.merge import merge
    from attngeom.store.ops.subset import subset

    src = pair["compact", "packed"]
    subset(src, tmp_path / "sub", layers=[1], heads=[0, 2], sequences="1:5")
    merge([src], tmp_path / "merged", no_text=True)        # shards rewritten without tokens
    whole = opened["compact", "packed"]
    for path, sel in ((tmp_path / "sub", dict(layer=[1], head=[0, 2], sequence=[1, 2, 3, 4])),
                      (tmp_path / "merged", {})):
        with h5py.File(next((path / "shards").glob("*.nc"))) as f:
            assert f["tail_alpha"].dtype == np.int16 and f["middle_count"].ndim == 3
        got = attngeom.store.open(path).load()
        want = whole.sel(sel) if sel else whole
        for name in PACKED_VARIABLES | {"middle_count": None, "contribution": None}:
            np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def test_zarr_export_of_a_packed_store_holds_decoded_floats(pair, opened, tmp_path):
    from attngeom.store.ops.export import export

    export(pair["compact", "packed"], tmp_path / "z", "zarr")
    z = xr.open_zarr(tmp_path / "z")
    ds = opened["compact", "packed"]
    for name in ("alpha", "tail_cosine", "middle_count", "tail_contribution"):
        assert z[name].dtype == np.float32 and z[name].dims == ds[name].dims, name
        np.testing.assert_array_equal(z[name].values, ds[name].values, err_msg=name)


def test_readme_code_opens_a_packed_store_with_plain_xarray(pair, opened):
    path, ds = pair["compact", "packed"], opened["compact", "packed"]
    text = (path / "README.txt").read_text()
    code = text.split("Opening with plain xarray\n", 1)[1].split("\n\nWith attngeom", 1)[0]
    scope: dict = {}
    exec(compile(textwrap.dedent(code).replace("path/to/store", str(path)), "README.txt",
                 "exec"), scope)                               # noqa: S102 (our own text)
    for name in S.DERIVED:
        # the README's formula and attngeom's on the same float32 values (4 roundings each)
        np.testing.assert_allclose(scope[name].transpose(*ds[name].dims).values,
                                   ds[name].values, equal_nan=True, err_msg=name,
                                   **tol.relative(4, vs=tol.F32))
    plain = scope["ds"]
    np.testing.assert_array_equal(plain["middle_count"].broadcast_like(plain["head"])
                                  .transpose(*S.PER_QUERY).values, ds["middle_count"].values)


def test_sink_rates_of_a_packed_store_are_within_the_alpha_error(opened):
    """An analysis reads a packed store like a float32 one: means of alpha move by at most
    e_alpha (each alpha does), and the sink heads are the same unless a rate sits at epsilon."""
    from attngeom.analysis import sinks

    a, b = (sinks(opened["compact", p]) for p in ("float32", "packed"))
    for name in ("sink_rate_mean", "sink_mass_mean", "layer_sink_rate_mean"):
        diff = np.abs(b[name].values - a[name].values)
        assert np.isfinite(diff).all() and diff.max() <= PROBABILITY.max_error * (1 + 1e-3), name
    np.testing.assert_array_equal(b["n_queries"].values, a["n_queries"].values)
    near = np.abs(a["sink_rate_mean"].values - a.attrs["epsilon"]) <= PROBABILITY.max_error
    np.testing.assert_array_equal(b["is_sink_head"].values[~near], a["is_sink_head"].values[~near])


def test_packed_variables_read_without_dask_are_the_dask_path_s(pair):
    """Blocks of a packed store: the CF-packed variables decode lazily through xarray both
    ways; the per-layer ones, broadcast over heads on opening, go through dask."""
    from attngeom.store.io.blockread import ENCODING_KEY

    ds = attngeom.store.open(pair["compact", "packed"])
    reads = ds.encoding[ENCODING_KEY]
    assert reads.readable(ds, "alpha") and not reads.readable(ds, "middle_count")
    assert reads.readable(ds, "value_norm") and ds["alpha"].encoding["dtype"] == np.int16
    names = [n for n, v in ds.data_vars.items() if "sequence" in v.dims and v.dtype.kind == "f"]
    layer = ds["layer"].values[1]
    got = ds.attngeom.load_block(names, layer=layer, sequences=slice(1, 5))
    ds.encoding.pop(ENCODING_KEY)
    ds.attngeom._mask_cache.clear()
    assert got.identical(ds.attngeom.load_block(names, layer=layer, sequences=slice(1, 5)))
