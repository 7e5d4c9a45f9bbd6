"""Derived quantities of a store, each implemented once: contributions, key groups, AOPC.

The functions use only arithmetic and indexing that numpy arrays and xarray objects share, so
the store (deriving on read), the analyses and the reports call the same definition. Extraction
computes the stored quantities in head space from Gram identities
(:mod:`attngeom.extract.measurement.geometry`); tests check both against the model-space
reference (tests/reference.py). The faithfulness metrics' scores are the metric registry's
(:mod:`attngeom.common.metrics`).

Contribution weights (notation of docs/concepts.md and docs/reference/store.md):

    c_ij^h = alpha_ij^h ||v~_j^h|| cos(o_i^h, v~_j^h) / ||o_i^h||       sums to 1 over keys j
    C_ij^h = alpha_ij^h ||v~_j^h|| cos(o_i,   v~_j^h) / ||o_i||         sums to 1 over h and j

Key groups of a query i, with k sink keys and a tail window w:

    sink    j < k
    tail    j = i - lag, lag = 0..w-1, j >= k      (the w most recent non-sink keys up to i)
    middle  every other key (k <= j <= i - w; for encoders also j > i)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import xarray as xr

from . import schema as S


def contribution(alpha, value_norm, cosine, output_norm):
    """c = alpha * ||v~|| * cos(o^h, v~) / ||o^h|| (any array type, broadcasting)."""
    return alpha * value_norm * cosine / output_norm


def contribution_layer(alpha, value_norm, cosine_layer, layer_output_norm):
    """C = alpha * ||v~|| * cos(o, v~) / ||o|| (any array type, broadcasting)."""
    return alpha * value_norm * cosine_layer / layer_output_norm


class Derived(NamedTuple):
    """A pair variable derived on read: formula(alpha, value_norm of the key, cosine, norm of
    the query's output)."""

    cosine: str
    norm: str
    formula: Callable

    def parts(self, prefix: str = "") -> tuple[str, ...]:
        """The stored variables it is made of (``prefix``: "" or ``tail_``)."""
        return prefix + S.ALPHA, prefix + self.cosine, S.VALUE_NORM, self.norm


# every derived pair variable: the one table the store's readers, block reads and key groups use
DERIVED = {S.CONTRIBUTION: Derived(S.COSINE, S.OUTPUT_NORM, contribution),
           S.CONTRIBUTION_LAYER: Derived(S.COSINE_LAYER, S.LAYER_OUTPUT_NORM,
                                         contribution_layer)}


def split(name: str) -> tuple[str, str]:
    """(base name, ``tail_`` or "") of a pair variable."""
    if name.startswith(S.TAIL_PREFIX):
        return name[len(S.TAIL_PREFIX):], S.TAIL_PREFIX
    return name, ""


def slot_value_norm(value_norm, slot: str, n_positions: int, n_slots: int):
    """The value norm of the key in each (query, slot) cell: (..., key) -> (..., query, slot).

    ``slot`` is the slot dim: ``sink`` (key = slot: the first ``n_slots`` keys), ``lag`` (key =
    query - lag, clipped at 0: masks say which cells are tail keys) or ``key`` (every key).
    numpy and dask arrays alike.
    """
    if slot == S.LAG:
        key = tail_keys(n_positions, 0, n_slots)[0]                     # (query, lag)
        return value_norm[..., key.ravel()].reshape(value_norm.shape[:-1] + key.shape)
    rows = value_norm[..., None, :n_slots] if slot == S.SINK else value_norm[..., None, :]
    return np.broadcast_to(rows, value_norm.shape[:-1] + (n_positions, rows.shape[-1]))


def derive_pair(name: str, get: Callable[[str], xr.Variable], n_positions: int) -> xr.Variable:
    """Derived pair variable ``name`` (``contribution``, ``tail_contribution_layer``, ...) from
    its stored parts, ``get(part) -> xarray.Variable`` (numpy or dask data), in float32 and in
    the dims of its alpha."""
    base, prefix = split(name)
    derived = DERIVED[base]
    alpha, cosine, vn, norm = (get(p) for p in derived.parts(prefix))
    slot = alpha.dims[-1]
    gathered = slot_value_norm(vn.data, slot, n_positions, alpha.shape[-1])
    vn = xr.Variable(vn.dims[:-1] + (S.QUERY, slot), gathered)
    return derived.formula(alpha, vn, cosine, norm).transpose(*alpha.dims).astype("float32")


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
