"""Parts of the float32 scores' error bounds measured from the layer itself (issue 46).

:attr:`FastLayer.normaliser` is the float32 softmax normaliser's rounding, read from alpha's
row sums: against float64 softmax of the same float32 logits, each row's alpha is off by a
factor common to the row (its median ratio to the exact alpha, up to the per-key roundings of
the exponential and the division), which the measurement must cover; where a learned sink
takes part of a row's weight the row sum says nothing of it, and the model's sqrt(Tk) stands.
"""

from __future__ import annotations

import pytest
import torch

from attngeom.extract.faithfulness.removal_scores import FastLayer

U = torch.finfo(torch.float32).eps / 2


@pytest.mark.parametrize("Tk", [512, 4096])
def test_normaliser_covers_the_rows_common_factor(Tk):
    gen = torch.Generator().manual_seed(Tk)
    logits = 3 * torch.randn(1, 4, 16, Tk, generator=gen)
    alpha = torch.softmax(logits, -1)                                   # float32, as the pass
    exact = torch.softmax(logits.double(), -1)
    common = ((alpha.double() / exact).median(-1).values - 1).abs() / U  # |c - 1| in units of u
    D = FastLayer(alpha, None, None, torch.zeros(1, 4, 16)).normaliser.double()
    # the median's per-key part: the exponential's and the division's roundings, ~1 u
    assert (common <= D + 1).all(), float((common - D).max())
    assert common.max() > 4                  # a real common factor: D = 1 would not cover it
    assert D.median() < Tk ** 0.5 / 8        # far below the model's sqrt(Tk)


def test_normaliser_falls_back_to_the_model_with_learned_sinks():
    class Context:
        sinks = torch.zeros(4)

    alpha = torch.softmax(torch.randn(1, 4, 8, 9), -1) * 0.9            # 0.1 on the sink
    x = FastLayer(alpha, None, None, torch.zeros(1, 4, 8), context=Context())
    assert torch.equal(x.normaliser, torch.full((1, 4, 8), 3.0))         # sqrt(Tk), Tk = 9
