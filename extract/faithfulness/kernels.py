"""Each metric's two score kernels, found by the metric's name (built-in) or its strings (plugin).

The registry (:mod:`attngeom.common.metrics`) is torch-free and describes a metric; the kernels
that compute its scores are here, in one table from name to functions (:data:`BUILTIN`): the
float32 ``fast`` kernel of a whole layer with its error bound (:mod:`.removal_scores`,
:mod:`.field_scores`, :mod:`.random_scores`, :mod:`.zeroing`), the float64 ``exact`` definition
(:mod:`.exact_scores`, ...) and, for a metric that needs the layers below, the ``step`` each
layer of a pass takes, intervened or not, before its removal (``step(context, alpha)``: it
keeps what the kernels read in ``context.carry``). A plugin's entry names its kernels as
``"module:function"`` strings, imported on first use (:func:`resolve`). The kernel modules
import none of this; the dispatchers that call the kernels by name are above it
(:mod:`.layer_scores`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Callable

from attngeom.common import metrics
from attngeom.common.errors import Refusal

from . import exact_scores as E
from . import field_scores as F
from . import random_scores as Q
from . import removal_scores as R
from . import zeroing as Z


@dataclass(frozen=True)
class Kernels:
    """A metric's float32 kernel (whole layer, with its error bound) and float64 kernel."""

    fast: Callable
    exact: Callable
    step: Callable | None = None


BUILTIN: dict[str, Kernels] = {
    "attention": Kernels(R.fast_attention, E.exact_attention),
    "value_weighted": Kernels(R.fast_value_weighted, E.exact_value_weighted),
    "value_weighted_normalized": Kernels(R.fast_value_weighted_normalized,
                                         E.exact_value_weighted_normalized),
    "contribution": Kernels(R.fast_contribution, E.exact_contribution),
    "contribution_layer": Kernels(R.fast_contribution_layer, E.exact_contribution_layer),
    "random": Kernels(Q.fast_random, Q.exact_random),
    "alti": Kernels(F.fast_alti, F.exact_alti),
    "alti_sa": Kernels(F.fast_alti_sa, F.exact_alti_sa),
    "norm_residual": Kernels(F.fast_norm_residual, F.exact_norm_residual),
    "norm_residual_sa": Kernels(F.fast_norm_residual_sa, F.exact_norm_residual_sa),
    "rollout": Kernels(F.fast_rollout, F.exact_rollout, F.step_rollout),
    "value_zeroing": Kernels(Z.fast_value_zeroing, Z.exact_value_zeroing),
}


@cache
def resolve(path: str) -> Callable:
    """The function a plugin's entry names as ``"module:function"``."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise Refusal(f"metric kernel '{path}' cannot be loaded ({exc}); check the "
                         "metric's registration (attngeom/common/metrics.py)") from exc


def kernels(name: str) -> Kernels:
    """The kernels of the registered metric ``name``."""
    entry = metrics.get(name)
    if entry.builtin:
        if name not in BUILTIN:
            raise ValueError(f"built-in metric '{name}' has no kernels in "
                             "attngeom/extract/faithfulness/kernels.py; add them to BUILTIN")
        return BUILTIN[name]
    return Kernels(resolve(entry.fast), resolve(entry.exact))
