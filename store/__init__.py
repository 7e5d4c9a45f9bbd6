"""The labeled on-disk format: schema, shards, manifest, opening and validation.

``attngeom.store.open(path)`` (or ``xarray.open_dataset(path, engine="attngeom")``) returns one
lazily loaded xarray.Dataset over all shards; ``attngeom.store.write(ds, path)`` saves such a
Dataset (or one ``attngeom.measure`` made in memory) as a store. Importing this package
registers the ``ds.attngeom`` accessor (:mod:`attngeom.store.accessor`) that reads both
layouts alike.
"""

from . import accessor  # noqa: F401  (registers ds.attngeom)
from .manifest import StoreError, read_manifest
from .reader import open_store as open
from .reader import open_store
from .save import write

__all__ = ["open", "open_store", "write", "read_manifest", "StoreError"]
