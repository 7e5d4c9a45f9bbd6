"""The architecture sweep: every tiny config of ``tests/tiny_archs.py`` through attngeom.

Supported ones: dense and compact measurements, with padding in the batch, against the
independent float64 reference built from the modelling file's own eager attention
(``reference.eager_measure``: alpha as eager returns it, the values eager received, W_O named per
architecture by the test), to 1e-5 relative to max(1, |reference|). The reference first checks
itself: sum_h sum_j alpha v~ + b_O must be the named projection's real output. Refused ones must
give their one-line reason. The README's "Supported architectures" table must be the one
``coverage_table`` writes from these results.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

import reference as ref
import tiny_archs as ta
from store_helpers import PER_TOKEN, cancellation, expected_compact
from attngeom.extract.archs import Unsupported, discover
from attngeom.extract.capture import measure
from attngeom.extract.measure import Options

SINK_K, TAIL_W = 1, 4
ROOT = Path(__file__).resolve().parents[2]


def close(got, want, name: str, scale=1.0, tol: float = 1e-5) -> None:
    """NaN at the same cells; |got - want| <= tol * max(1, |want|) (x scale) elsewhere."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (
        f"{name}: NaN pattern differs at {np.argwhere(np.isnan(got) != np.isnan(want))[:4]}")
    ok = ~np.isnan(want)
    assert ok.any(), f"{name}: nothing compared"
    limit = tol * np.maximum(1.0, np.abs(want)) * np.broadcast_to(scale, want.shape)
    bad = (np.abs(got - want) > limit) & ok
    assert not bad.any(), (f"{name}: {bad.sum()} of {ok.sum()} differ, e.g. got {got[bad][:3]} "
                           f"want {want[bad][:3]}")


@functools.lru_cache(maxsize=None)
def _model(name: str):
    return ta.build(name)


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    model = _model(name)
    return ref.eager_measure(model, ta.inputs(name), ta.ARCHS[name].w_o, sink_k=SINK_K)


def _defined(r: dict, inputs: dict) -> np.ndarray:
    """(B, L, H, T) cells where the sink's value is a real token's (always, right padding)."""
    return ~np.isnan(r["value_norm"])


@pytest.mark.parametrize("name", ta.SUPPORTED)
def test_measurements_equal_the_eager_reference(name):
    model = _model(name)
    inputs = ta.inputs(name)
    r, calls = _reference(name)
    arch = discover(model)
    assert len(arch.layers) == len(calls) == 2
    for call in calls:                       # the reference's own W_O and values are right
        assert ref.eager_reconstruction_error(call) < 1e-5 * max(
            1.0, float(np.abs(call.module_output).max())), name
    learned = arch.learned_sinks
    assert learned == (name == "gpt_oss")
    dense = measure(model, inputs, Options("dense", SINK_K, TAIL_W))
    compact = measure(model, inputs, Options("compact", SINK_K, TAIL_W))
    names = [n for n in r if n != "learned_sink_alpha"] + (["learned_sink_alpha"] if learned else [])
    for n in names:
        scale = cancellation(r) if n == "sink_residual_cosine" else 1.0
        close(dense[n], r[n], f"{name} dense {n}", scale)
        if n in PER_TOKEN or n == "learned_sink_alpha":
            close(compact[n], r[n], f"{name} compact {n}", scale)
    if not learned:
        assert "learned_sink_alpha" not in dense and np.allclose(r["learned_sink_alpha"][
            ~np.isnan(r["learned_sink_alpha"])], 0, atol=1e-6)
    want = expected_compact(r, SINK_K, TAIL_W)
    if learned:
        want["middle_alpha"] = want["middle_alpha"]          # real keys only: unchanged
    for n, x in want.items():
        close(compact[n], x, f"{name} compact {n}")


def test_gpt_oss_learned_sink_takes_mass_and_contributions_still_sum_to_one():
    """learned_sink_alpha = the weight eager gives the sink (1 - sum of its real-key
    probabilities); alpha over real keys + the learned sink = 1; c over real keys sums to 1."""
    model, inputs = _model("gpt_oss"), ta.inputs("gpt_oss")
    r, calls = _reference("gpt_oss")
    eager_sink = np.stack([1.0 - c.alpha.sum(-1) for c in calls], 1)        # (B, L, H, T)
    real = ~np.isnan(r["output_norm"])
    assert eager_sink[real].mean() > 0.05                                    # the sink bites
    dense = measure(model, inputs, Options("dense", SINK_K, TAIL_W))
    close(dense["learned_sink_alpha"][real], eager_sink[real], "learned_sink_alpha")
    total = np.nansum(dense["alpha"], -1) + dense["learned_sink_alpha"]
    np.testing.assert_allclose(total[real], 1.0, atol=1e-5)
    np.testing.assert_allclose(np.nansum(dense["contribution"], -1)[real], 1.0, atol=1e-4)
    compact = measure(model, inputs, Options("compact", SINK_K, TAIL_W))
    parts = (np.nansum(compact["alpha"], -1) + np.nansum(compact["tail_alpha"], -1)
             + compact["middle_alpha"] + compact["learned_sink_alpha"])
    np.testing.assert_allclose(parts[real], 1.0, atol=1e-5)
    summed = (np.nansum(compact["contribution"], -1) + np.nansum(compact["tail_contribution"], -1)
              + compact["middle_contribution"])
    np.testing.assert_allclose(summed[real], 1.0, atol=1e-5)


@pytest.mark.parametrize("name", ta.REFUSED)
def test_refused_with_its_reason(name):
    try:
        model = ta.build(name)
    except Exception as exc:                   # noqa: BLE001 - the config itself must build
        pytest.fail(f"{name}: the tiny config does not build ({exc})")
    with pytest.raises(Unsupported) as info:
        discover(model)
    message = str(info.value)
    assert "\n" not in message and ta.ARCHS[name].refused in message, message
