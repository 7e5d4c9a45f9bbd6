"""The attention registry hook: handler state per block and per thread, refusals reported."""

from __future__ import annotations

import threading

import pytest
import torch

import tiny_models as tm
from attngeom.extract.measurement.hooks import Unsupported, attention_handler


class Recorder:
    """A handler that records (module, index) of each call and returns plain attention."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def attend(self, call):
        self.calls.append((id(call.module), call.index))
        q, k, v = call.query, call.key, call.value
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        logits = (q @ k.transpose(-1, -2)) * call.scaling
        logits = logits.masked_fill(~call.allowed, float("-inf"))
        return torch.softmax(logits, -1) @ v


def _attention_modules(model) -> list[int]:
    return [id(layer.self_attn) for layer in model.model.layers]


def test_two_threads_each_see_only_their_own_handler():
    """Thread B's block is open while thread A runs its forward: A's calls reach A's handler,
    numbered from 0; with one process-wide stack they would all go to B's."""
    models = [tm.build("llama", seed=0), tm.build("llama", seed=1)]
    recorders = [Recorder(), Recorder()]
    a_entered, b_entered, a_done = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def run(i, wait_for, then_set, before_forward=None):
        try:
            inputs = tm.example_inputs("llama", models[i])
            with torch.inference_mode(), attention_handler(models[i], recorders[i]):
                then_set.set()
                assert wait_for.wait(30)
                if before_forward is not None:
                    assert before_forward.wait(30)
                models[i](**inputs)
                if i == 0:
                    a_done.set()
        except Exception as exc:               # noqa: BLE001 - reported below
            errors.append(exc)
            then_set.set()
            a_done.set()

    a = threading.Thread(target=run, args=(0, b_entered, a_entered))
    b = threading.Thread(target=run, args=(1, a_entered, b_entered, a_done))
    a.start(), b.start()
    a.join(60), b.join(60)
    assert not errors, errors
    n = len(models[0].model.layers)
    for model, rec in zip(models, recorders):
        assert rec.calls == list(zip(_attention_modules(model), range(n)))


def test_nested_blocks_count_from_zero_and_restore_the_outer_one():
    model = tm.build("llama", seed=0)
    inputs = tm.example_inputs("llama", model)
    outer, inner = Recorder(), Recorder()
    n = len(model.model.layers)
    with torch.inference_mode(), attention_handler(model, outer):
        model(**inputs)
        with attention_handler(model, inner):
            model(**inputs)
        model(**inputs)
    assert [i for _, i in inner.calls] == list(range(n))
    assert [i for _, i in outer.calls] == list(range(n)) + list(range(n, 2 * n))
    assert model.config._attn_implementation != "attngeom"


def test_a_refused_implementation_is_reported(monkeypatch):
    model = tm.build("llama", seed=0)
    before = model.config._attn_implementation

    def refuse(impl):
        raise ValueError(f"{impl} is not a valid attention implementation")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(Unsupported, match="refuses the 'attngeom' attention implementation"):
        with attention_handler(model, Recorder()):
            pass
    assert model.config._attn_implementation == before
