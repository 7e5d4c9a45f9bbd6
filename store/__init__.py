"""The labeled on-disk format: schema, shards, manifest, opening and validation.

``attngeom.store.open(path)`` returns one lazily loaded xarray.Dataset over all shards.
"""

from .manifest import StoreError, read_manifest
from .reader import open_store as open
from .reader import open_store

__all__ = ["open", "open_store", "read_manifest", "StoreError"]
