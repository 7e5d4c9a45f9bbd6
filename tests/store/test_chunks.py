"""Chunks compressed outside HDF5 (store/format/chunks.py) against HDF5's own filter pipeline."""

from __future__ import annotations

import io

import h5py
import numpy as np
import pytest
import xarray as xr

from attngeom.store.format.chunks import ChunkEncoder, cut_chunks, encode_chunk, fletcher32
from attngeom.store.format.shards import encoding, write_shard
from attngeom.store.io.writer import write_netcdf


def fletcher32_loop(data: bytes) -> int:
    """HDF5's H5_checksum_fletcher32 transcribed word by word (the reference)."""
    n, s1, s2, i = len(data) // 2, 0, 0, 0
    while n:
        t = min(n, 360)
        n -= t
        for _ in range(t):
            s1 += (data[i] << 8) | data[i + 1]
            s2 += s1
            i += 2
        s1, s2 = (s1 & 0xFFFF) + (s1 >> 16), (s2 & 0xFFFF) + (s2 >> 16)
    if len(data) % 2:
        s1 += data[i] << 8
        s2 += s1
        s1, s2 = (s1 & 0xFFFF) + (s1 >> 16), (s2 & 0xFFFF) + (s2 >> 16)
    s1, s2 = (s1 & 0xFFFF) + (s1 >> 16), (s2 & 0xFFFF) + (s2 >> 16)
    return (s2 << 16) | s1


def test_cut_chunks_leaves_partial_chunks_until_final_then_pads_them():
    rows = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)          # 8 rows cut 3 at a time
    parts = [rows[:2], rows[2:7], rows[7:]]
    whole, blocks, rest = cut_chunks(parts, 3, final=False)
    assert whole == 6 and [lo for lo, _ in blocks] == [0, 3]
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), rows[:6])
    np.testing.assert_array_equal(np.concatenate(rest), rows[6:])
    whole, blocks, rest = cut_chunks(parts, 3, final=True)
    assert whole == 8 and [lo for lo, _ in blocks] == [0, 3, 6] and rest == []
    np.testing.assert_array_equal(blocks[2][1][:2], rows[6:])
    assert blocks[2][1].shape == (3, 2) and np.isnan(blocks[2][1][2]).all()
    packed = [np.ones((1, 2), np.int16)]                              # int16: the packed fill
    assert cut_chunks(packed, 3, final=False) == (0, [], packed)
    assert cut_chunks(packed, 3, final=True)[1][0][1][1:].tolist() == [[-32768] * 2] * 2


@pytest.mark.parametrize("data", [b"", b"\x01", b"ab", b"\xff" * 721, b"\xff" * 65536,
                                  bytes(range(256)) * 9 + b"\x07", b"\x00" * 1000,
                                  b"\xff\xff", b"\x00" * 1001 + b"\xff\xff", b"\x00\x01" * 65535,
                                  b"\x00" * 720 + b"\x01"])   # non-zero multiples of 65535; an odd byte
def test_fletcher32_edge_cases_match_the_c_loop(data):
    assert fletcher32(data) == fletcher32_loop(data)


def test_fletcher32_random_lengths_match_the_c_loop():
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 5000, size=25):
        data = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
        assert fletcher32(data) == fletcher32_loop(data)


def test_fletcher32_read_in_segments_matches_the_c_loop():
    """The words are read a few blocks at a time (memory): every segment size, block-aligned
    or not at the end, odd lengths, gives the checksum of the whole."""
    rng = np.random.default_rng(1)
    for n in (720 * 3, 720 * 3 + 1, 720 * 5 + 333, 4000, 7201):
        data = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
        want = fletcher32_loop(data)
        assert [fletcher32(data, segment=s) for s in (1, 2, 3, 4096)] == [want] * 4, n


def _hdf5_chunks(x: np.ndarray, chunks: tuple[int, ...]) -> dict:
    """Chunk offset -> bytes as HDF5 itself stores ``x`` with shuffle+gzip 1+Fletcher-32."""
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        d = f.create_dataset("x", data=x, chunks=chunks, shuffle=True, compression="gzip",
                             compression_opts=1, fletcher32=True, fillvalue=np.float32(np.nan))
        out = {}
        for i in range(d.id.get_num_chunks()):
            offset = d.id.get_chunk_info(i).chunk_offset
            out[offset] = d.id.read_direct_chunk(offset)[1]
    return out


@pytest.mark.parametrize("kind", ["normal", "nan_padded", "zeros", "constant"])
def test_encode_chunk_is_byte_identical_to_hdf5(kind, zlib_deflate):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 5, 37)).astype(np.float32)
    if kind == "nan_padded":
        x[..., 20:] = np.nan
    elif kind == "zeros":
        x[:] = 0
    elif kind == "constant":
        x[:] = 1.5
    hdf5 = _hdf5_chunks(x, (3, 1, 5, 37))
    for layer in range(2):
        assert encode_chunk(x[:, layer:layer + 1]) == hdf5[(0, layer, 0, 0)]


def _shard(rng, n=7, layers=3, heads=2, T=50, w=4) -> xr.Dataset:
    tail = rng.standard_normal((n, layers, heads, T, w)).astype(np.float32)
    tail[:, :, :, 40:] = np.nan
    norm = rng.standard_normal((n, layers, heads, T)).astype(np.float32)
    return xr.Dataset(
        {"tail_alpha": (("sequence", "layer", "head", "query", "lag"), tail, {"description": "a"}),
         "value_norm": (("sequence", "layer", "head", "position"), norm, {"description": "b"}),
         "length": (("sequence",), np.arange(n, dtype=np.int32))},
        coords={"sequence": np.arange(n), "layer": np.arange(layers), "head": np.arange(heads),
                "query": np.arange(T), "position": np.arange(T)}, attrs={"model": "m"})


def test_isal_deflate_is_a_zlib_stream_hdf5_reads():
    """The default compressor's chunks: a zlib stream of the shuffled bytes, the checksum
    HDF5 verifies; h5py reads them back (test_encoded_shard_reads_with_netcdf_c: netCDF-C)."""
    import zlib

    from attngeom.store.format.chunks import deflate

    pytest.importorskip("isal")
    assert deflate() is not zlib.compress
    x = np.random.default_rng(5).standard_normal((3, 1, 5, 37)).astype(np.float32)
    blob = encode_chunk(x)
    shuffled = x.view(np.uint8).reshape(-1, 4).T.tobytes()
    assert zlib.decompress(blob[:-4]) == shuffled
    assert fletcher32(blob[:-4]).to_bytes(4, "little") == blob[-4:]


@pytest.mark.parametrize("during", [0, 1, 2])
@pytest.mark.parametrize("batches", [[2, 3, 2], [7], [1] * 7])
def test_encoded_shard_equals_hdf5_written_shard(tmp_path, during, batches, zlib_deflate):
    ds = _shard(np.random.default_rng(2))
    enc = ChunkEncoder(rows=3, during=during, after=3)
    start = 0
    for b in batches:
        enc.add({n: ds[n].values[start:start + b] for n in ("tail_alpha", "value_norm")})
        start += b
        assert bool(enc.futures["tail_alpha"]) == (during > 0 and start >= 3)
    write_shard(ds, tmp_path / "new.nc", enc.finish())
    write_netcdf(ds, tmp_path / "old.nc", encoding(ds, rows=3))
    with xr.open_dataset(tmp_path / "new.nc") as new, xr.open_dataset(tmp_path / "old.nc") as old:
        assert new.identical(old)
    with h5py.File(tmp_path / "new.nc") as f, h5py.File(tmp_path / "old.nc") as g:
        for name in ("tail_alpha", "value_norm"):
            a, b = f[name], g[name]
            assert (a.chunks, a.compression, a.shuffle, a.fletcher32) == \
                   (b.chunks, "gzip", True, True)
            assert a.id.get_num_chunks() == b.id.get_num_chunks() == 3 * 3
            for i in range(a.id.get_num_chunks()):
                offset = a.id.get_chunk_info(i).chunk_offset
                if offset[0] + 3 <= 7:              # edge chunks: padding beyond the data differs
                    assert a.id.read_direct_chunk(offset) == b.id.read_direct_chunk(offset)


def test_encoded_shard_reads_with_netcdf_c(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    ds = _shard(np.random.default_rng(3))
    enc = ChunkEncoder(rows=2, during=1, after=1)
    enc.add({"tail_alpha": ds["tail_alpha"].values})
    write_shard(ds, tmp_path / "s.nc", enc.finish())
    with netCDF4.Dataset(tmp_path / "s.nc") as nc:
        got = np.ma.filled(nc["tail_alpha"][:], np.nan)
        assert nc["tail_alpha"].filters()["fletcher32"]
    np.testing.assert_array_equal(got, ds["tail_alpha"].values)


def test_damaged_encoded_chunk_fails_to_read(tmp_path):
    ds = _shard(np.random.default_rng(4))
    enc = ChunkEncoder(rows=7, during=0, after=2)
    enc.add({"value_norm": ds["value_norm"].values})
    encoded = enc.finish()
    blob = bytearray(encoded["value_norm"].blobs[(0, 1, 0, 0)])
    blob[len(blob) // 2] ^= 0x01
    encoded["value_norm"].blobs[(0, 1, 0, 0)] = bytes(blob)
    write_shard(ds, tmp_path / "s.nc", encoded)
    with h5py.File(tmp_path / "s.nc") as f:
        f["value_norm"][:, 0]                            # undamaged layer reads
        with pytest.raises(OSError):
            f["value_norm"][:, 1]
