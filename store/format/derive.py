"""Derived quantities of a store, each implemented once: contributions, key groups, AOPC.

The functions use only arithmetic and indexing that numpy arrays and xarray objects share, so
the store (deriving on read), the analyses and the reports call the same definition. Extraction
computes the stored quantities in head space from Gram identities
(:mod:`attngeom.extract.measurement.geometry`); tests check both against the model-space
reference (tests/reference.py). The faithfulness metrics' scores are the metric registry's
(:mod:`attngeom.store.format.metrics`).

Contribution weights (notation of README.md, "The store"):

    c_ij^h = alpha_ij^h ||v~_j^h|| cos(o_i^h, v~_j^h) / ||o_i^h||       sums to 1 over keys j
    C_ij^h = alpha_ij^h ||v~_j^h|| cos(o_i,   v~_j^h) / ||o_i||         sums to 1 over h and j

Key groups of a query i, with k sink keys and a tail window w:

    sink    j < k
    tail    j = i - lag, lag = 0..w-1, j >= k      (the w most recent non-sink keys up to i)
    middle  every other key (k <= j <= i - w; for encoders also j > i)
"""

from __future__ import annotations

import numpy as np


def contribution(alpha, value_norm, cosine, output_norm):
    """c = alpha * ||v~|| * cos(o^h, v~) / ||o^h|| (any array type, broadcasting)."""
    return alpha * value_norm * cosine / output_norm


def contribution_layer(alpha, value_norm, cosine_layer, layer_output_norm):
    """C = alpha * ||v~|| * cos(o, v~) / ||o|| (any array type, broadcasting)."""
    return alpha * value_norm * cosine_layer / layer_output_norm


def tail_keys(n_positions: int, k: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, w) key index j = i - lag clipped at 0, and whether (i, lag) is a tail key (j >= k)."""
    j = np.arange(n_positions)[:, None] - np.arange(w)[None]
    return np.clip(j, 0, None), j >= k


def middle_mask(n_positions: int, k: int, w: int) -> np.ndarray:
    """(T, T) bool: key j is a middle key of query i (neither sink nor tail)."""
    i = np.arange(n_positions)[:, None]
    j = np.arange(n_positions)[None]
    tail = (j <= i) & (j > i - w)
    return (j >= k) & ~tail


def aopc(loss, dim: str = "fraction"):
    """Area over the perturbation curve: the mean loss over the swept fractions (NaN stays NaN).

    ERASER's 1/(|P|+1) sum also counts the trivial p = 0 term; this differs from it by the
    constant factor |P|/(|P|+1) only. ``loss`` is an xarray object with dimension ``dim``.
    """
    return loss.astype(float).mean(dim, skipna=False)


AOPC_NOTE = ("AOPC = mean over the swept fractions p of the loss at p (ERASER's 1/(|P|+1) sum "
             "also counts the trivial p = 0 term; this differs by the constant factor "
             "|P|/(|P|+1) only)")
