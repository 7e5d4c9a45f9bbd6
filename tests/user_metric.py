"""A metric of one's own, as a user would register it (tests/extract/test_metric_registry.py):
value_norm, the key's projected value norm ||v~_j^h|| alone (attention ignored where allowed)."""

from __future__ import annotations

import torch

from attngeom.extract.faithfulness.base import finite
from attngeom.extract.faithfulness.selection import ErrorBound
from attngeom.store.format.metrics import Metric

ENTRY = Metric("value_norm", symbol="‖ṽ‖", words="value norm", short="value norm",
               abbrev="vn", paper="projected value norm alone", nonnegative=True,
               fast="user_metric:fast_value_norm", exact="user_metric:exact_value_norm")


def fast_value_norm(x, unit):
    """||v~_j|| where alpha > 0 (0 where the key is not attended), float32."""
    score = torch.where(x.alpha > 0, x.value_norm[:, :, None, :], 0.0)
    return score, ErrorBound(unit * x.lam)


def exact_value_norm(x):
    return finite(torch.where(x.alpha > 0, x.value_norm()[..., None, :], 0.0))
