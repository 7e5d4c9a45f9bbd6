"""Reading and writing stores: opening (one lazy read path, lazy.py, that dask chunks and block
reads index; the xarray engine), the writer, README.txt, results and resumable result files,
validation."""
