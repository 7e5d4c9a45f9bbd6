"""Opening a store: one lazily loaded (dask) xarray.Dataset over all shards.

Each shard is checked against the manifest (:class:`ShardCheck`); the variables are
:class:`~attngeom.store.io.lazy.ShardsArray` over every shard, decoded lazily by xarray and
chunked by dask one chunk per shard and layer. Opening executes nothing from the files: the
manifest is JSON, shards are HDF5 read by h5netcdf and h5py, attributes are plain strings and
numbers.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from ..format import derive
from .blockread import ENCODING_KEY, DirectReads
from .lazy import CHUNK_CACHE_BYTES, lazy_store
from ..format import schema as S
from ..format.manifest import check_coverage, config_hash, read_manifest
from attngeom.common.errors import StoreError
from ..format.packing import precision_of
from ..format.shards import expected_labels, expected_variables, layout_problem

def shard_paths(store: str | Path, manifest: dict) -> list[Path]:
    entries = sorted(manifest["shards"], key=lambda e: e["sequences"][0])
    return [Path(store) / e["file"] for e in entries]


def open_store(path: str | Path, partial: bool = False, derived: bool = True) -> xr.Dataset:
    """Open a store as one lazily loaded ``xarray.Dataset``.

    Parameters
    ----------
    path : str or Path
        The store directory.
    partial : bool
        Read the finished shards of an incomplete store (otherwise refused).
    derived : bool
        Add ``contribution`` and ``contribution_layer``, computed lazily on read.

    Returns
    -------
    xarray.Dataset
        Dims ``sequence, layer, head, position, query, key`` (+ ``sink``, ``lag`` in compact
        stores), the manifest's provenance in ``attrs``.

    Raises
    ------
    attngeom.common.errors.StoreError
        For an incomplete store (without ``partial``), a missing or damaged shard, or a
        manifest edited or damaged: the message names the fix.
    """
    manifest = read_manifest(path)
    if config_hash(manifest["config"]) != manifest["config_hash"]:
        raise StoreError(f"{path}: the manifest's config does not match its config_hash "
                         "(edited or damaged); restore the manifest or re-extract")
    if not manifest["complete"] and not partial:
        done = sum(e["sequences"][1] - e["sequences"][0] for e in manifest["shards"])
        raise StoreError(f"{path}: incomplete store ({done} of {manifest['n_sequences']} "
                         "sequences); rerun the extract command to resume, or pass partial=True")
    check_coverage(path, manifest, partial=not manifest["complete"])
    files = shard_paths(path, manifest)
    if not files:
        raise StoreError(f"{path}: the store holds no sequences")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise StoreError(f"{missing[0]}: shard listed in the manifest is missing; "
                         "run `attngeom store validate` and re-extract")
    entries = dict(zip(files, sorted(manifest["shards"], key=lambda e: e["sequences"][0])))
    try:
        attrs, check = store_attrs(manifest), ShardCheck(manifest, entries)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise StoreError(f"{path}: manifest config lacks {exc} or has the wrong type; damaged "
                         "manifest: restore it or re-extract") from None
    sizes = [e["sequences"][1] - e["sequences"][0] for e in entries.values()]
    strings: dict[str, np.dtype] = {}                # each string variable's widest dtype
    try:
        for file in files:                            # each shard belongs here and is whole
            with xr.open_dataset(file, engine="h5netcdf",
                                 driver_kwds={"rdcc_nbytes": CHUNK_CACHE_BYTES}) as shard:
                check(shard)
                for name, var in shard.data_vars.items():
                    if var.dtype.kind == "U":
                        strings[name] = max(strings.get(name, var.dtype), var.dtype,
                                            key=lambda d: d.itemsize)
        lazy = xr.decode_cf(lazy_store(files, sizes, strings))
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - h5py/h5netcdf/xarray reject damaged files
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise StoreError(f"{path}: cannot read shards ({text}); run `attngeom store validate` "
                         "and re-extract the damaged shards") from None
    with warnings.catch_warnings():
        # one dask chunk per shard and layer, on purpose (whole stored chunks along sequence);
        # xarray's advice about such chunks is no business of the user's
        warnings.filterwarnings("ignore", "The specified chunks separate", UserWarning)
        ds = lazy.chunk({S.SEQUENCE: tuple(sizes), S.LAYER: 1})
    ds.attrs = attrs
    ds.encoding[ENCODING_KEY] = DirectReads.record(ds, lazy)
    ds = per_head(ds)
    return add_derived(ds) if derived else ds


def per_head(ds: xr.Dataset) -> xr.Dataset:
    """Variables a packed store keeps once per layer
    (:data:`attngeom.store.format.schema.HEAD_FREE`) broadcast (lazily) over ``head``, so that both
    precisions open with the same dims."""
    for name in S.HEAD_FREE:
        if name in ds and S.HEAD not in ds[name].dims and S.HEAD in ds.dims:
            var = ds[name]
            ds[name] = var.broadcast_like(ds[S.HEAD]).transpose(*S.DIMS[name])
            ds[name].attrs = dict(var.attrs)
    return ds


class ShardCheck:
    """``preprocess`` of open_mfdataset: each shard must belong to this store and be whole.

    Checks the config hash (same model, data and options), the sequence range the manifest
    records, and the layout the manifest describes
    (:func:`attngeom.store.format.shards.layout_problem`: variables, their dims, layers, heads,
    max_length, sink_k, tail_w), so that a file of another shape is refused, not read as the store.
    """

    def __init__(self, manifest: dict, entries: dict[Path, dict]):
        self.manifest, self.entries = manifest, entries
        expected_labels(manifest)                # KeyError/TypeError: a damaged manifest

    def __call__(self, ds: xr.Dataset) -> xr.Dataset:
        source = Path(ds.encoding.get("source", ""))
        entry = next((e for f, e in self.entries.items() if f.name == source.name
                      and f.parent.name == source.parent.name), None)
        name = entry["file"] if entry else source.name
        if ds.attrs.get("attngeom_config_hash") != self.manifest["config_hash"]:
            raise StoreError(f"{name}: made with another model, data or options than this store "
                             "(config hash differs); remove it and rerun the extract command")
        why = layout_problem(self.manifest, {n: v.dims for n, v in ds.data_vars.items()},
                             {d: ds[d].values for d in ds.dims if d in ds.coords})
        if why is None:
            why = next((f"variable {v} has dtype {ds[v].dtype}, not float32"
                        for v in expected_variables(self.manifest) - {"token_id", "length"}
                        if ds[v].dtype.kind != "f"), None)
        if why:
            raise StoreError(f"{name}: {why}; the shard does not fit this store's manifest: "
                             "run `attngeom store validate` and re-extract it")
        lo, hi = entry["sequences"] if entry else (None, None)
        seq = ds[S.SEQUENCE].values if S.SEQUENCE in ds.coords else None
        if seq is None or entry is None or len(seq) != hi - lo or int(seq[0]) != lo \
                or int(seq[-1]) != hi - 1:
            raise StoreError(f"{name}: its sequences do not match the manifest's range "
                             f"[{lo}, {hi}); damaged or misplaced shard")
        return ds


def store_attrs(manifest: dict) -> dict:
    cfg = manifest["config"]
    opts = cfg["options"]
    return {
        "model": cfg["model"]["id"], "mode": opts["mode"], "sink_k": opts["sink_k"],
        "tail_w": opts["tail_w"], "max_length": opts["max_length"],
        "causal": int(cfg["model"]["causal"]), "precision": precision_of(opts),
        "config_hash": manifest["config_hash"],
        "data": cfg["data"]["spec"], "data_sha256": cfg["data"]["sha256"],
        "attngeom_manifest": json.dumps(manifest, sort_keys=True),
    }


def describe_store(manifest: dict) -> dict:
    """What a comparison of stores labels and flags a store by: model id and its number of
    layers (the model's, so a subset store keeps its relative depth), data spec and sha256, BOS
    choice, layout, k, w, max_length, float type, number of sequences; a results-only store
    has no layout (None)."""
    cfg = manifest["config"]
    opts, data, model = cfg.get("options", {}), cfg.get("data", {}), cfg.get("model", {})
    return {"model": model.get("id", ""), "n_layers": model.get("n_layers"),
            "causal": bool(model.get("causal", True)), "data": data.get("spec", ""),
            "data_sha256": data.get("sha256"), "bos": data.get("bos", "auto"),
            "mode": opts.get("mode"), "sink_k": opts.get("sink_k"),
            "tail_w": opts.get("tail_w"), "max_length": opts.get("max_length"),
            "dtype": model.get("dtype"), "n_sequences": manifest.get("n_sequences", 0)}


def add_derived(ds: xr.Dataset) -> xr.Dataset:
    """contribution = alpha * value_norm * cosine / output_norm (and the layer version).

    Added lazily (:func:`attngeom.store.format.derive.derive_pair`) for the pair variables and,
    in compact stores, the tail window (whose value norms are gathered at key = query - lag).
    """
    if S.ALPHA not in ds:
        return ds
    prefixes = ("", S.TAIL_PREFIX) if S.TAIL_PREFIX + S.ALPHA in ds else ("",)
    for prefix in prefixes:
        for base in derive.DERIVED:
            name = prefix + base
            ds[name] = derive.derive_pair(name, ds.variables.__getitem__, ds.sizes[S.QUERY])
            ds[name].attrs["description"] = S.DESCRIPTIONS[name] + " (derived on read)"
    return ds
