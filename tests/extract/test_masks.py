"""The layers' masks made once per forward pass (extract/faithfulness/masks.py).

What a removal pass reads of a mask (the allowed and eligible keys, their counts, last
positions, row blocks and -inf / +inf biases) against a direct computation from the mask, the
memo's hits and misses, and one handler run over batches of other padding in turn against a
fresh handler for each: the same logits, bit for bit (a mask kept from the batch before would
change them).
"""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from attngeom.extract.faithfulness.dense import row_blocks
from attngeom.extract.faithfulness.interventions import (Intervener, Removal, eligible_keys,
                                                         forward_logits)
from attngeom.extract.faithfulness.masks import layer_masks


def test_what_a_pass_reads_of_a_mask_against_the_mask_itself():
    T = 9
    model_mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(2, 1, T, T)
    tokens = torch.ones(2, T, dtype=torch.bool)
    tokens[1, 6:] = False
    memo: dict = {}
    masks = layer_masks(memo, model_mask, tokens)
    allowed = model_mask & tokens[:, None, None, :]
    eligible = eligible_keys(model_mask, tokens)
    assert torch.equal(masks.allowed, allowed) and torch.equal(masks.eligible.mask, eligible)
    assert masks.blocks == row_blocks(allowed)
    assert torch.equal(masks.eligible.count, eligible.sum(-1))
    last = torch.tensor([[max((j + 1 for j in range(T) if eligible[b, 0, i, j]), default=0)
                          for i in range(T)] for b in range(2)])
    assert torch.equal(masks.eligible.last[:, 0].long(), last)
    for fill in (-torch.inf, torch.inf):
        want = torch.zeros(2, 1, T, T).masked_fill(~eligible, fill)
        assert torch.equal(masks.eligible.fill(fill, torch.float32), want)
    assert layer_masks(memo, model_mask, tokens) is masks                   # the same tensors
    assert layer_masks(memo, model_mask[:, :, :, :], tokens) is masks        # another view
    other = tokens.clone()
    assert layer_masks(memo, model_mask, other) is not masks                 # other memory
    full = torch.ones(2, T, dtype=torch.bool)
    assert layer_masks(memo, model_mask, full).eligible is layer_masks(memo, model_mask,
                                                                       full).attended


def test_one_handler_over_batches_of_other_padding_is_a_fresh_handler_each():
    model = tm.build("llama", seed=3)
    removal = Removal("contribution", "comprehensiveness", 0.3)
    batches = [tm.example_inputs("llama", model, batch=3, seq_len=14, seed=s) for s in (1, 2)]
    batches[1]["attention_mask"][0, 9:] = 0                   # padding of its own
    batches.append({"input_ids": batches[0]["input_ids"][:2, :11]})   # no mask at all
    shared = Intervener(model, removal=removal)
    for inputs in batches + batches[:1]:
        want = forward_logits(model, inputs, Intervener(model, removal=removal))
        shared.self_counts = None                             # a count per batch
        assert torch.equal(forward_logits(model, inputs, shared), want)


@pytest.mark.parametrize("layout", ["head", "query"])
def test_self_counts_are_read_from_the_factor_in_either_layout(layout):
    """Rows with a removal and rows removing their own key, counted from the kept factor as
    head granularity gives it (contiguous) and as query granularity does (a view with the
    heads of a query side by side), against a loop over the rows."""
    B, H, T = 2, 3, 9
    gen = torch.Generator().manual_seed(0)
    kept = (torch.rand(B, H, T, T, generator=gen) > 0.2).float()
    kept[0, 1, 4] = 1.0                                            # a row without a removal
    if layout == "query":
        kept = kept.transpose(1, 2).contiguous().transpose(1, 2)
        assert not kept.is_contiguous()
    handler = Intervener(tm.build("llama"), removal=Removal("attention", "comprehensiveness",
                                                            0.1, granularity=layout))
    handler.count_self(kept, torch.ones(B, H, T, T, dtype=torch.bool))
    want = [[sum(bool((kept[b, h, i] == 0).any()) for h in range(H) for i in range(T)),
             sum(bool(kept[b, h, i, i] == 0) for h in range(H) for i in range(T))]
            for b in range(B)]
    assert handler.self_counts.tolist() == want
