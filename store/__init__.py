"""The labeled on-disk format: schema, shards, manifest, opening and validation.

``attngeom.store.open(path)`` (or ``xarray.open_dataset(path, engine="attngeom")``) returns one
lazily loaded xarray.Dataset over all shards; importing this package registers the
``ds.attngeom`` accessor (:mod:`attngeom.store.accessor`) that reads both layouts alike.
"""

from . import accessor  # noqa: F401  (registers ds.attngeom)
from .manifest import StoreError, read_manifest
from .reader import open_store as open
from .reader import open_store

__all__ = ["open", "open_store", "read_manifest", "StoreError"]
