"""attngeom: contribution weights and attention-sink geometry for Hugging Face transformers.

Data flows through four subpackages::

    attngeom.extract   model in, measurements out (the only part that imports torch)
    attngeom.store     the labeled on-disk format (HDF5/netCDF shards + manifest)
    attngeom.analysis  CPU statistics on an opened store
    attngeom.reports   figures and PDF documents

``attngeom.measure(model, inputs)`` measures a loaded model in memory (an ``xarray.Dataset``
like an opened store; ``attngeom.store.write`` saves it as one), ``attngeom.view(ds,
sequence=0)`` is an interactive view of a store or measurement (a self-contained HTML page;
inline in Jupyter). Attributes load on first use, so that ``import attngeom`` stays cheap
(no torch until ``measure`` is called).
"""

__version__ = "0.1.0"

_LAZY = {"view": ("attngeom.reports.view", "view"),        # name -> (module, attribute)
         "measure": ("attngeom.extract.measurement.inmemory", "measure"),
         "scores": ("attngeom.extract.faithfulness.attribution", "scores")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'attngeom' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
