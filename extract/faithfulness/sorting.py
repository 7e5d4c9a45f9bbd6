"""Rows sorted in place on the CPU: numpy's vectorised sort and partition, in blocks of rows on
torch's threads (numpy sorts on one thread and releases the GIL while it does). The removal
pass's cut (:func:`~.selection.find_cut`) reads each row's ranks through these; at long
contexts they are its largest step.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import workers

Tensor = torch.Tensor
PARALLEL_SORT = 1 << 19  # values per thread below which one thread sorts alone


def sort_rows_(x: Tensor) -> Tensor:
    """Each row of x (R, N) in ascending order, in place (numpy's vectorised sort on the CPU,
    in blocks of rows on torch's threads: numpy sorts on one, and this is the removal pass's
    largest step at long contexts)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return _in_blocks(x, lambda rows: rows.sort(axis=-1))
    return x.copy_(torch.sort(x, dim=-1).values)


def sort_ranks_(x: Tensor, first: int, last: int) -> Tensor:
    """Rows of x (R, N) rearranged in place so that columns ``first`` to ``last`` hold what a
    sort of each row puts there: where they lie within a quarter of the row from one end, a
    partition at the window's inner edge (numpy's introselect, about 2/3 of a sort's time) and
    a sort of that end alone; elsewhere a whole sort."""
    N = x.shape[1]
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return sort_rows_(x)
    if N - first <= N // 4:
        return _in_blocks(x, lambda rows: (rows.partition(first, axis=-1),
                                           rows[:, first:].sort(axis=-1)))
    if last + 1 <= N // 4:
        return _in_blocks(x, lambda rows: (rows.partition(last, axis=-1),
                                           rows[:, :last + 1].sort(axis=-1)))
    return sort_rows_(x)


def _in_blocks(x: Tensor, step) -> Tensor:
    """``step`` (in place) on blocks of x's rows as numpy arrays, on torch's threads."""
    rows = x.numpy()
    threads = min(torch.get_num_threads(), max(1, x.numel() // PARALLEL_SORT))
    if threads == 1:
        step(rows)
        return x
    edges = np.linspace(0, len(rows), threads + 1).astype(int)
    list(workers("sort", threads).map(lambda lo, hi: step(rows[lo:hi]), edges[:-1], edges[1:]))
    return x
