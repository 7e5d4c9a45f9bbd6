"""``attngeom.store.write(ds, path)``: a Dataset with a store's names and attrs saved as a store.

``ds`` is a measurement held in memory (``attngeom.measure``) or an opened store
(``attngeom.store.open``). Its ``attngeom_manifest`` attribute gives the config, which the new
store keeps unchanged (so it has the Dataset's ``config_hash``; only ``no_text``, or a
Dataset without token strings, records ``store_text`` false). The shards go through the one
writer, :class:`attngeom.store.io.writer.StoreWriter` (``new`` -> ``add_shard`` -> ``finish``):
files of the config's ``shard_size`` sequences, each with its checksum in the manifest, and
README.txt. Derived variables (the contributions) are not stored: the store derives them on
read. Faithfulness results recorded in a store are files beside it, not part of the Dataset,
and are not copied (``attngeom store subset`` copies a store with them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from ..format import schema as S
from ..format.manifest import carried, config_hash, without_text
from attngeom.common.errors import StoreError
from ..format.shards import layout_problem
from .writer import StoreWriter

MANIFEST_ATTR = "attngeom_manifest"


def manifest_of(ds: xr.Dataset) -> dict:
    """The manifest recorded in ``ds.attrs`` (StoreError when missing or edited)."""
    text = ds.attrs.get(MANIFEST_ATTR)
    if not isinstance(text, str):
        raise StoreError("the Dataset has no attngeom_manifest attribute: write a Dataset from "
                         "attngeom.measure or attngeom.store.open (xarray operations that drop "
                         "attrs lose it; keep them with keep_attrs=True)")
    try:
        manifest = json.loads(text)
        digest = config_hash(manifest["config"])
    except (ValueError, KeyError, TypeError):
        raise StoreError("the Dataset's attngeom_manifest attribute is damaged; measure or "
                         "open the store again") from None
    if digest != manifest.get("config_hash") or digest != ds.attrs.get("config_hash"):
        raise StoreError("the Dataset's config does not match its config_hash (attrs edited); "
                         "measure or open the store again")
    return manifest


def stored_names(ds: xr.Dataset) -> list[str]:
    """The variables of ``ds`` a shard stores: the schema's, derived ones left out."""
    return [n for n in ds.data_vars if (n in S.DIMS or n == "token") and n not in S.DERIVED]


def _check_whole(ds: xr.Dataset, manifest: dict, names: list[str]) -> None:
    n = int(manifest["n_sequences"])
    seq = ds[S.SEQUENCE].values if S.SEQUENCE in ds.coords else None
    if seq is None or not np.array_equal(seq, np.arange(n)):
        got = "none" if seq is None else f"{len(seq)} starting at {int(seq[0]) if len(seq) else 0}"
        raise StoreError(f"the Dataset holds sequences {got}, not the {n} (0..{n - 1}) its config "
                         "describes; write the whole Dataset (cut a store with `attngeom store "
                         "subset`)")
    why = layout_problem(manifest, {name: ds[name].dims for name in names},
                         {d: ds[d].values for d in ds.dims if d in ds.coords})
    if why:
        raise StoreError(f"the Dataset does not fit the store its attrs describe ({why}); write "
                         "it whole (cut a store with `attngeom store subset`)")


def write(ds: xr.Dataset, path: str | Path, no_text: bool = False) -> dict:
    """Save ``ds`` as a store at ``path`` (a new or empty folder); return its manifest.

    Parameters
    ----------
    ds : xarray.Dataset
        From ``attngeom.measure`` or ``attngeom.store.open``, whole: every sequence, layer
        and head its config describes.
    path : str or Path
        The store folder to create.
    no_text : bool
        Leave token strings out (``store_text`` false, as ``--no-text``).

    Returns
    -------
    dict
        The new store's manifest.

    Raises
    ------
    attngeom.common.errors.StoreError
        One line, with the fix, for a Dataset without attngeom attrs, a cut of one, or a
        ``path`` that exists and is not empty.
    """
    manifest = manifest_of(ds)
    names = [n for n in stored_names(ds) if not (no_text and n == "token")]
    _check_whole(ds, manifest, names)
    config = without_text(manifest["config"], "token" not in names)
    extra = carried(manifest, "in_memory")
    n = int(manifest["n_sequences"])
    size = int(config["options"]["shard_size"])
    writer = StoreWriter.new(path, config, n, extra)
    for index, start in enumerate(range(0, n, size)):
        block = ds[names].isel({S.SEQUENCE: slice(start, start + size)}).load()
        for var in block.variables.values():
            var.encoding = {}                    # the store's own chunking and filters
        block.attrs = {}
        writer.add_shard(block, index)
    return writer.finish()
