"""attngeom: contribution weights and attention-sink geometry for Hugging Face transformers.

Data flows through four subpackages::

    attngeom.extract   model in, measurements out (the only part that imports torch)
    attngeom.store     the labeled on-disk format (HDF5/netCDF shards + manifest)
    attngeom.analysis  CPU statistics on an opened store
    attngeom.reports   figures and PDF documents
"""

__version__ = "0.1.0"
