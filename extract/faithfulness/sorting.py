"""Values at given sorted places of each row, on the CPU: numpy's partition, one row at a time, in
blocks of rows on torch's threads (numpy partitions on one thread and releases the GIL while it
does). The removal pass's cut (:func:`~.selection.find_cut`) reads each row's two ranks through
this; at long contexts it is one of its largest steps.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import workers

Tensor = torch.Tensor
PARALLEL_SORT = 1 << 19  # values per thread below which one thread partitions alone


def rank_values_(x: Tensor, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """The values (R,), (R,) that a sort of each row of x (R, N) puts at places ``lower`` and
    ``upper`` (R,), upper = lower or lower + 1; x's rows are rearranged in place.

    Each row is partitioned at whichever place lies nearer its end (numpy's introselect), and
    the other value is the extreme of the short side beyond it: at a cut 10 % from one end
    this costs about 4/5 of a partition at a place shared by the rows and a sort of the
    window from there (``benchmarks/RESULTS.md``). Ties and infinities as in a sort; no NaN
    (the ranking keys are finite or infinite).
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        s = torch.sort(x, dim=-1).values
        return s.gather(-1, lower[:, None])[:, 0], s.gather(-1, upper[:, None])[:, 0]
    rows, R = x.numpy(), x.shape[0]
    low, high = np.empty(R, rows.dtype), np.empty(R, rows.dtype)
    places = lower.cpu().numpy(), upper.cpu().numpy()
    threads = min(torch.get_num_threads(), max(1, x.numel() // PARALLEL_SORT))
    edges = np.linspace(0, R, threads + 1).astype(int)
    run = lambda lo, hi: _rank_values(rows[lo:hi], *(p[lo:hi] for p in places),  # noqa: E731
                                      low[lo:hi], high[lo:hi])
    if threads == 1:
        run(0, R)
    else:
        list(workers("sort", threads).map(run, edges[:-1], edges[1:]))
    return torch.from_numpy(low), torch.from_numpy(high)


def _rank_values(rows: np.ndarray, lower: np.ndarray, upper: np.ndarray, low: np.ndarray,
                 high: np.ndarray) -> None:
    """:func:`rank_values_` of some rows, into ``low`` and ``high``."""
    N = rows.shape[1]
    for r, (row, lo, up) in enumerate(zip(rows, lower.tolist(), upper.tolist())):
        if N - up <= lo:                             # the short side above: partition at lower
            row.partition(lo)
            low[r], high[r] = row[lo], row[up] if up == lo else row[up:].min()
        else:
            row.partition(up)
            high[r], low[r] = row[up], row[lo] if up == lo else row[:up].max()
