"""What a result was made with: the versions of attngeom and the packages its numbers depend on,
recorded in every store's manifest and every faithfulness result."""

from __future__ import annotations


def versions() -> dict:
    """``{package: version}`` of attngeom, torch, transformers, xarray, h5py and numpy."""
    import h5py
    import numpy as np
    import torch
    import transformers
    import xarray

    from attngeom import __version__

    return {"attngeom": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "xarray": xarray.__version__,
            "h5py": h5py.__version__, "numpy": np.__version__}
