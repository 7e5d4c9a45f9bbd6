"""The opened Dataset: the ``ds.attngeom`` accessor, its key groups, and dask scheduling."""
