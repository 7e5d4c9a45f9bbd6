"""The random floor's scores: both kernels (numpy's uint32 on a CPU, torch's int64 elsewhere)
give the hash as :func:`mix` defines it, exactly (integer arithmetic, then a 24-bit value
scaled by 2^-24, exact in float32 and float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attngeom.extract.faithfulness import random_scores as R

N, KEYS = 37, 11
CUT = [(lo, min(N, lo + 5)) for lo in range(0, N, 5)]         # several chunks, a short last one


def _reference(base: torch.Tensor) -> torch.Tensor:
    """The definition, written out: mix(base xor mix(key + GOLDEN)) >> 8, an integer < 2^24."""
    j = torch.arange(KEYS, dtype=torch.int64)
    return R.mix(base[:, None] ^ R.mix(j + R.GOLDEN & R.MASK)[None]) >> 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_kernels_are_the_defined_hash(dtype):
    base = torch.randint(0, 2 ** 32, (N,), generator=torch.Generator().manual_seed(1))
    key_hash = R.mix(torch.arange(KEYS) + R.GOLDEN & R.MASK)
    want = _reference(base).double()
    on_torch = torch.empty(N, KEYS, dtype=dtype)
    R._fill_torch(on_torch, base, key_hash, CUT)
    on_numpy = np.empty((N, KEYS), dtype=on_torch.numpy().dtype)
    R._fill_numpy(on_numpy, base.numpy().astype(np.uint32), key_hash.numpy().astype(np.uint32),
                  CUT)
    assert torch.equal(on_torch.double(), want)
    assert np.array_equal(on_numpy.astype(np.float64), want.numpy())
    scores = R.fill(torch.empty(N, KEYS, dtype=dtype), base)               # the CPU's path
    assert torch.equal(scores.double(), want / (1 << 24))
    assert ((scores >= 0) & (scores < 1)).all()
