"""Removal passes started at the lowest intervened layer equal full passes bit for bit.

The full pass is the same commit's forward with every layer run (``decoder_stack`` made to
find nothing); the per-layer design (``--layers L``) must give identical log-probs either way,
on decoders whose layers differ in kind (Gemma 3's sliding and global layers), with padding
in the batch. GPT-2 adds its position embeddings to ``inputs_embeds``, so its forward from a
layer differs and it must run in full, with the same numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_models as tm
from attngeom.extract.faithfulness import experiment as E
from attngeom.extract.faithfulness import resume
from attngeom.extract.measurement.archs import decoder_stack
from attngeom.extract.faithfulness.experiment import compute_block, conditions, ranking_plan
from attngeom.extract.faithfulness.scoring import prepare_texts
from attngeom.store.options.stages import FaithConfig

TEXTS = ["we can make all of the people look up and write more than one number",
         "the one is there and it was the time of people who said",
         "a way to see them", "it is what they said for this one", "there was a time"]


def _config(arch: str):
    config = tm.make_config(arch)
    for name in ("num_hidden_layers", "n_layer"):
        if hasattr(config, name):
            setattr(config, name, 4)
    if getattr(config, "layer_types", None) is not None:            # one per layer
        sliding = getattr(config, "sliding_window", None) is not None
        config.layer_types = ["sliding_attention" if sliding and i % 2 == 0 else
                              "full_attention" for i in range(4)]
        if sliding:
            config.sliding_window = 4               # shorter than the texts: the kinds differ
    return config


def _model(arch: str):
    torch.manual_seed(0)
    model = tm._model_class(arch)(_config(arch)).eval()
    model.config._attn_implementation = "eager"
    return model


def _run(model, tok, layers, full: bool, monkeypatch, log):
    if full:
        monkeypatch.setattr(E, "decoder_stack", lambda m: None)
    cfg = FaithConfig(metrics=("attention", "contribution"), ranks=("signed",),
                      fractions=(0.25, 0.5), modes=("comprehensiveness", "sufficiency"),
                      layers=layers, drift=False, batch_size=3, max_length=16)
    prepared = prepare_texts(tok, TEXTS, cfg.max_length)
    removals = conditions(cfg, ranking_plan(cfg.metrics, cfg.ranks, cfg.granularity))
    out = compute_block(model, prepared, cfg, removals, tok.pad_token_id or 0, log=log)
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("arch,start", [("llama", 2), ("gemma3", 1), ("gemma3", 2),
                                        ("qwen2", 2)])
def test_resumed_passes_equal_full_passes(arch, start, monkeypatch):
    """Gemma 3 from layer 1: a global layer where the stack's first is sliding."""
    model, tok = _model(arch), tm.make_tokenizer(arch)
    calls = []
    real = resume.logits_from
    monkeypatch.setattr(E, "logits_from", lambda *a: calls.append(a[2]) or real(*a))
    messages = []
    fast = _run(model, tok, (start,), False, monkeypatch, messages.append)
    assert calls and set(calls) == {start} and not messages   # it did start at that layer
    full = _run(model, tok, (start,), True, monkeypatch, messages.append)
    np.testing.assert_array_equal(fast["clean"], full["clean"])
    np.testing.assert_array_equal(fast["removal"], full["removal"])
    assert not np.array_equal(full["removal"][0], full["clean"])   # the removal did something


def test_gpt2_adds_positions_to_inputs_embeds_so_it_runs_in_full(monkeypatch):
    model, tok = _model("gpt2"), tm.make_tokenizer("gpt2")
    messages = []
    out = _run(model, tok, (2,), False, monkeypatch, messages.append)
    full = _run(model, tok, (2,), True, monkeypatch, messages.append)
    assert messages[:1] == ["faithfulness: this model's forward from layer 2 differs from its full "
                        "pass; every removal pass runs in full"]
    np.testing.assert_array_equal(out["removal"], full["removal"])


def test_a_forward_that_differs_from_layer_start_falls_back(monkeypatch):
    model, tok = _model("llama"), tm.make_tokenizer("llama")
    real = resume.logits_from
    monkeypatch.setattr(E, "logits_from", lambda *a: real(*a) + 1e-3)   # a wrong cut-down run
    messages = []
    out = _run(model, tok, (1,), False, monkeypatch, messages.append)
    full = _run(model, tok, (1,), True, monkeypatch, messages.append)
    assert any("runs in full" in m for m in messages)
    np.testing.assert_array_equal(out["removal"], full["removal"])


def test_the_stack_found_is_the_layer_list():
    model = _model("gpt2")
    owner, name, layers = decoder_stack(model)
    assert layers is model.transformer.h and name == "h"
