"""The labeled on-disk format: schema, shards, manifest, opening and validation.

``attngeom.store.open(path)`` returns one lazily loaded xarray.Dataset over all shards;
``attngeom.store.write(ds, path)`` saves such a Dataset (or one ``attngeom.measure`` made in
memory) as a store.
"""

from .manifest import StoreError, read_manifest
from .reader import open_store as open
from .reader import open_store
from .save import write

__all__ = ["open", "open_store", "write", "read_manifest", "StoreError"]
