"""The passes' dense attention (attngeom.extract.faithfulness.dense): row blocks and alpha @ v over
them."""

from __future__ import annotations

import torch

import tolerance as tol
from attngeom.extract.faithfulness.dense import row_blocks, weighted_values


def _causal(T: int, Tk: int | None = None) -> torch.Tensor:
    Tk = T if Tk is None else Tk
    return torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)


def test_row_blocks_cover_every_allowed_key():
    assert row_blocks(_causal(10)[None, None]) == ((0, 3, 3), (3, 6, 6), (6, 9, 9), (9, 10, 10))
    assert row_blocks(torch.ones(2, 1, 7, 7, dtype=torch.bool)) == ((0, 7, 7),)   # no stop
    g = torch.Generator().manual_seed(0)
    allowed = _causal(13)[None, None] & (torch.rand(3, 2, 13, 13, generator=g) < 0.7)
    allowed[:, :, 5:9] = False                                     # rows with no key at all
    for t0, t1, w in row_blocks(allowed, parts=5):
        assert not allowed[..., t0:t1, w:].any()                   # nothing allowed past w
        assert w == 0 or allowed[..., t0:t1, w - 1].any()          # and w is the least such


def test_alpha_times_values_over_blocks_is_the_full_product():
    g = torch.Generator().manual_seed(1)
    B, H, G, T, n = 2, 6, 3, 37, 5
    allowed = _causal(T)[None, None].expand(B, 1, T, T)
    alpha = torch.rand(B, H, T, T, generator=g) * allowed          # zero past the mask
    value = torch.randn(B, G, T, n, generator=g)
    want = alpha.double() @ value.double().repeat_interleave(H // G, 1)
    blocks = row_blocks(allowed)
    assert len(blocks) == 4
    got = weighted_values(alpha, value, blocks)
    assert got.dtype == torch.float32 and got.shape == (B, H, T, n)
    # float32 dots of length T, against float64 and against another blocking of the same sum
    size = (alpha.double() @ value.double().abs().repeat_interleave(H // G, 1)).numpy()
    tol.assert_close(got.numpy(), want.numpy(), tol.dot(T, size, vs=tol.F64), "alpha v")
    tol.assert_close(weighted_values(alpha, value).numpy(), got.numpy(),
                     tol.dot(T, size, vs=tol.F32), "alpha v, one block")
    empty = weighted_values(alpha * 0, value, ((0, 10, 0), (10, T, T)))
    assert torch.equal(empty, torch.zeros_like(empty))
