"""The labeled on-disk format: schema, shards, manifest, opening and validation.

``attngeom.store.open(path)`` (or ``xarray.open_dataset(path, engine="attngeom")``) returns one
lazily loaded xarray.Dataset over all shards; ``attngeom.store.write(ds, path)`` saves such a
Dataset (or one ``attngeom.measure`` made in memory) as a store; ``attngeom.store.import_export(
DIR, path)`` rebuilds a store from a Hub export (``store export --format hf``). Importing this package
registers the ``ds.attngeom`` accessor (:mod:`attngeom.store.dataset.accessor`) that reads both
layouts alike.
"""

from .dataset import accessor# noqa: F401  (registers ds.attngeom)
from .format.manifest import read_manifest
from attngeom.common.errors import StoreError
from .io.reader import open_store as open
from .io.reader import open_store
from .io.save import write
from .ops.hub_import import import_export

__all__ = ["open", "open_store", "write", "import_export", "read_manifest", "StoreError"]
