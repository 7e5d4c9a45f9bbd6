"""Section ``precision`` of ``bench_store.py``: store bytes of ``--precision float32`` and
``packed`` from the same texts, side by side (see bench_store.py's docstring)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import LLAMA31_8B, SMOLLM2, emit, log, random_llama

PRECISIONS = ("float32", "packed")
SCALE_LAYERS = 32                     # Llama-3.1-8B's layers


def _models(a):
    """(case name, Loaded, number of texts, layers to scale to or None), built one at a time."""
    from attngeom.extract.loading.models import Loaded, load, model_info

    try:
        real = load("smollm2-135m")
    except (ValueError, ImportError, OSError) as exc:
        emit({"bench": "store", "section": "precision", "case": "smollm2-135m",
              "skipped": str(exc)[:200]})
        real = None
    tok = real.tokenizer if real is not None else None
    if real is not None:
        yield "smollm2-135m", real, a.texts, None
    if tok is None:
        return
    shapes = [("smollm2-shaped random", SMOLLM2, None, a.texts, None),
              ("llama-3.1-8b-shaped random, 2 layers", LLAMA31_8B, 2, a.llama_texts,
               SCALE_LAYERS)]
    for name, shape, layers, n, scale in shapes:
        model = random_llama(dict(shape, vocab_size=len(tok)), layers=layers)
        yield name, Loaded(model, tok, model_info(name, model, tok, None, "float32")), n, scale
        del model


def _write(loaded, texts, out: Path, precision: str, T: int) -> float:
    """A compact store of ``texts`` as ``attngeom extract`` writes it; returns seconds."""
    from attngeom.extract.measurement.layer import Options
    from attngeom.extract.run import ExtractConfig, extract_shard, store_config
    from attngeom.store.io.writer import StoreWriter

    cfg = ExtractConfig(mode="compact", max_length=T, precision=precision)
    config = store_config(loaded.info, texts, cfg, len(texts.texts))
    t0 = time.perf_counter()
    writer = StoreWriter.create(out, config, len(texts.texts), {})
    ds, encoded = extract_shard(loaded, texts.texts, 0, cfg, Options("compact", derived=False))
    writer.add_shard(ds, 0, encoded)
    writer.finish()
    return time.perf_counter() - t0


def _sizes(store: Path, precision: str) -> dict:
    """Bytes of the shard files: all, and per variable (HDF5 storage size) with its dims;
    real tokens."""
    import h5py
    import xarray as xr

    out = {"file": 0, "variables": {}, "dims": {}, "tokens": 0, "precision": precision}
    for shard in sorted((store / "shards").glob("*.nc")):
        out["file"] += shard.stat().st_size
        with h5py.File(shard) as f:
            for n, d in f.items():
                if isinstance(d, h5py.Dataset):
                    out["variables"][n] = out["variables"].get(n, 0) + d.id.get_storage_size()
        with xr.open_dataset(shard, engine="h5netcdf") as ds:
            out["dims"].update({n: ds[n].dims for n in ds.variables})
            out["tokens"] += int(ds["length"].sum())
    return out


def _recipe_bytes(store: Path, info: dict) -> float:
    """Bytes per head and token of the float32 store's values written as the issue's recipe
    alone: every bounded variable int16 at 16 bits (cosines step 1/32767), the other floats
    exact float32, middle_count once per layer (HDF5 with the store's chunks and filters)."""
    import io

    import h5py

    from attngeom.store.format import schema as S
    from attngeom.store.format.packing import PACKED_VARIABLES, Packing, pack

    total, tokens = 0, 0
    for shard in sorted((store / "shards").glob("*.nc")):
        with h5py.File(shard) as f, h5py.File(io.BytesIO(), "w") as g:
            tokens += int(f["length"][()].sum())
            for name in S.variables_for("compact"):
                x, chunks = f[name][()], f[name].chunks
                if name in S.HEAD_FREE:
                    x, chunks = x[:, :, 0], chunks[:2] + chunks[3:]
                if name in PACKED_VARIABLES:
                    p = PACKED_VARIABLES[name]
                    x = pack(name, x) if p.qmax == 32767 else _pack16(x, Packing(p.low, p.high,
                                                                                 32767))
                d = g.create_dataset(name, data=x, chunks=chunks, shuffle=True, fletcher32=True,
                                     compression="gzip", compression_opts=1)
                total += d.id.get_storage_size()
    return total / (tokens * info["n_layers"] * info["n_heads"])


def _pack16(x, p):
    q = np.rint((np.clip(x, p.low, p.high) - float(p.add_offset)) / float(p.scale_factor))
    return np.where(np.isfinite(x), q, -32768).astype(np.int16)


def _errors(stores: dict[str, Path]) -> dict:
    """Largest |packed - float32| per packed variable (and its bound) and per contribution
    (and its largest ratio to the bound of store/format/packing.py)."""
    import attngeom.store
    from attngeom.store.format import schema as S
    from attngeom.store.format.packing import (COSINE, PACKED_VARIABLES, PROBABILITY,
                                               contribution_bound)

    a, b = (attngeom.store.open(stores[p]).load() for p in PRECISIONS)
    out = {}
    for name, p in PACKED_VARIABLES.items():
        d = abs(b[name] - a[name].clip(p.low, p.high))
        out[name] = {"max_abs": float(d.max()), "bound": p.max_error}
    vn = a["value_norm"]
    sink_vn = vn.isel(key=slice(0, a.sizes[S.SINK])).rename(key=S.SINK).assign_coords(
        {S.SINK: a[S.SINK].values})
    key = (a[S.QUERY] - a[S.LAG]).clip(min=0)
    tail_vn = vn.drop_vars(S.KEY).isel(key=key.drop_vars([S.QUERY, S.LAG]))
    for prefix, value_norm in (("", sink_vn), ("tail_", tail_vn)):
        for kind, norm in (("", "output_norm"), ("_layer", "layer_output_norm")):
            name = f"{prefix}contribution{kind}"
            bound = contribution_bound(a[f"{prefix}alpha"], value_norm,
                                       a[f"{prefix}cosine{kind}"], a[norm],
                                       PROBABILITY.max_error, COSINE.max_error)
            d = abs(b[name].astype("float64") - a[name])
            c = abs(a[name])
            out[name] = {"max_abs": float(d.max()),
                         "max_over_bound": float((d / bound).where(bound > 0).max()),
                         "median_rel": float((d / c).where(c > 1e-3).median())}
    return out


def precision_section(a) -> None:
    from attngeom.extract.loading.data import load_texts

    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-precision-"))
    try:
        for case, loaded, n, scale in _models(a):
            texts = load_texts(a.data, limit=n)
            stores, rows = {}, {}
            for precision in PRECISIONS:
                stores[precision] = tmp / f"{len(rows)}-{precision}"
                seconds = _write(loaded, texts, stores[precision], precision, a.max_length)
                rows[precision] = _row(case, loaded.info, _sizes(stores[precision], precision), scale,
                                       seconds)
                emit(rows[precision])
                log(f"precision {case} {precision}: {rows[precision]['bytes_per_head_token']:.1f}"
                    f" bytes per head and token")
            f32, packed = rows["float32"], rows["packed"]
            recipe = _recipe_bytes(stores["float32"], loaded.info)
            emit({"bench": "store", "section": "precision", "case": case, "summary": True,
                  "tokens": f32["tokens"],
                  "recipe_alone_bytes_per_head_token": recipe,
                  "ratio_recipe_alone": recipe / f32["bytes_per_head_token"],
                  **{f"ratio_{k}": packed[k] / f32[k] for k in
                     ("bytes_per_head_token", "bytes_per_token", "file_bytes_per_token")},
                  **({f"bytes_per_token_{scale}_layers_{p}": rows[p]["scaled_bytes_per_token"]
                      for p in PRECISIONS} if scale else {}),
                  "target": "packed bytes per head and token <= 0.55 x float32",
                  "errors": _errors(stores)})
            for path in stores.values():
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _row(case: str, info: dict, sizes: dict, scale: int | None, seconds: float) -> dict:
    """Bytes per token and per head and token of one store (layer-dependent variables: the
    measured ones; the rest is per sequence and scales with tokens only)."""
    from attngeom.store.format import schema as S

    L, H, tokens = info["n_layers"], info["n_heads"], sizes["tokens"]
    per_layer = {n: b for n, b in sizes["variables"].items() if S.LAYER in sizes["dims"][n]
                 and n != S.LAYER}
    layer_bytes, other = sum(per_layer.values()), sizes["file"] - sum(per_layer.values())
    row = {"bench": "store", "section": "precision", "case": case,
           "precision": sizes["precision"], "layers": L, "heads": H, "tokens": tokens,
           "file_bytes": sizes["file"], "file_bytes_per_token": sizes["file"] / tokens,
           "bytes_per_token": layer_bytes / tokens,
           "bytes_per_head_token": layer_bytes / (tokens * L * H),
           "per_variable_bytes_per_head_token": {n: round(b / (tokens * L * H), 3)
                                                 for n, b in sorted(per_layer.items())},
           "measure_and_write_s": seconds}
    if scale:
        row["scaled_layers"] = scale
        row["scaled_bytes_per_token"] = (layer_bytes * scale / L + other) / tokens
    return row
