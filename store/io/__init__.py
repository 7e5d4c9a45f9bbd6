"""Reading and writing stores: atomic files, opening (dask and h5py paths, the xarray engine),
the writer, results and resumable result files, validation."""
