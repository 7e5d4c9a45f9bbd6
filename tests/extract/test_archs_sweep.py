"""The architecture sweep: every tiny config of ``tests/tiny_archs.py`` through attngeom.

Supported ones: dense and compact measurements, with padding in the batch, against the
independent float64 reference built from the modelling file's own eager attention
(``reference.eager_measure``: alpha as eager returns it, the values eager received, W_O named per
architecture by the test), within the measurements' rounding bounds (store_helpers). The
reference first checks itself: sum_h sum_j alpha v~ + b_O must be the named projection's real
output. Refused ones must
give their one-line reason. The sweep's results file, ``tests/extract/archs_sweep.json`` (the
documentation's architecture table is generated from it by ``python docs/generate.py``), must
hold these results: rewrite it with ``python tests/extract/test_archs_sweep.py --write``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

if __name__ == "__main__":                    # run as a script: the helpers live in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pytest

import reference as ref
import tiny_archs as ta
import tolerance as tol
from store_helpers import (PER_TOKEN, assert_same, compact_bounds, expected_compact,
                           forward_bound, measurement_bounds, model_dims,
                           module_output_size)
from attngeom.extract.measurement.archs import Unsupported, discover
from attngeom.extract.measurement.capture import capture
from attngeom.extract.measurement.layer import Options

SINK_K, TAIL_W = 1, 4
ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _model(name: str):
    return ta.build(name)


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    model = _model(name)
    return ref.eager_measure(model, ta.inputs(name), ta.ARCHS[name].w_o, sink_k=SINK_K)


@pytest.mark.parametrize("name", ta.SUPPORTED)
def test_measurements_equal_the_eager_reference(name):
    model = _model(name)
    inputs = ta.inputs(name)
    r, calls = _reference(name)
    arch = discover(model)
    assert len(arch.layers) == len(calls) == 2
    for call in calls:                       # the reference's own W_O and values are right
        B, H, T, Tk = call.alpha.shape       # eager's float32 z (Tk terms), then W_O (H dv)
        size = module_output_size(call.alpha, call.v, call.w_o, call.b_o)
        tol.assert_close(ref.eager_reconstruction(call), call.module_output, tol.dot(
            Tk + H * call.v.shape[-1], size, vs=tol.F64), f"{name} reconstruction")
    learned = arch.learned_sinks
    assert learned == (name == "gpt_oss")
    dense = capture(model, inputs, Options("dense", SINK_K, TAIL_W))
    compact = capture(model, inputs, Options("compact", SINK_K, TAIL_W))
    dims = model_dims(model)
    bound = measurement_bounds(r, dims)
    names = [n for n in r if n != "learned_sink_alpha"] + (["learned_sink_alpha"] if learned else [])
    for n in names:
        assert_same(dense[n], r[n], f"{name} dense {n}", bound[n])
        if n in PER_TOKEN or n == "learned_sink_alpha":
            assert_same(compact[n], r[n], f"{name} compact {n}", bound[n])
    bound = compact_bounds(r, dims, SINK_K, TAIL_W)
    T = r["alpha"].shape[-1]
    if not learned:                          # 1 - eager's float32 softmax row
        assert "learned_sink_alpha" not in dense
        np.testing.assert_allclose(r["learned_sink_alpha"][~np.isnan(r["learned_sink_alpha"])],
                                   0.0, **tol.sums_to_one(T, depth=T + 1))
    want = expected_compact(r, SINK_K, TAIL_W)           # middle_alpha: real keys only
    if learned:
        # the learned sink's weight must stay out of middle_alpha (1 - learned - sink - tail):
        # it is large enough everywhere that folding it in fails the comparison below, and the
        # compact budget with it closes to 1 at every real query
        real = ~np.isnan(r["output_norm"])
        assert np.nanmin(r["learned_sink_alpha"]) > 1e-3, name
        budget = (np.nansum(compact["alpha"], -1) + np.nansum(compact["tail_alpha"], -1)
                  + compact["middle_alpha"] + compact["learned_sink_alpha"])
        n = SINK_K + TAIL_W + 2                # middle = 1 - learned - sink - tail: rounding
        np.testing.assert_allclose(budget[real], 1.0, err_msg=name, **tol.sums_to_one(n, n))
    for n, x in want.items():
        assert_same(compact[n], x, f"{name} compact {n}", bound[n])


def test_gpt_oss_learned_sink_takes_mass_and_contributions_still_sum_to_one():
    """learned_sink_alpha = the weight eager gives the sink (1 - sum of its real-key
    probabilities); alpha over real keys + the learned sink = 1; c over real keys sums to 1."""
    model, inputs = _model("gpt_oss"), ta.inputs("gpt_oss")
    r, calls = _reference("gpt_oss")
    eager_sink = np.stack([1.0 - c.alpha.sum(-1) for c in calls], 1)        # (B, L, H, T)
    real = ~np.isnan(r["output_norm"])
    assert eager_sink[real].mean() > 0.05                                    # the sink bites
    dense = capture(model, inputs, Options("dense", SINK_K, TAIL_W))
    dims, T = model_dims(model), r["alpha"].shape[-1]
    bound = measurement_bounds(r, dims)
    assert_same(dense["learned_sink_alpha"][real], eager_sink[real], "learned_sink_alpha",
                bound["learned_sink_alpha"][real])
    total = np.nansum(dense["alpha"], -1) + dense["learned_sink_alpha"]
    # one softmax over the T keys and the sink
    np.testing.assert_allclose(total[real], 1.0, **tol.sums_to_one(T + 1, depth=T + 2))
    term = measurement_bounds(dense, dims, vs=None)["contribution"]
    c = dense["contribution"]
    tol.assert_close(np.nansum(c, -1)[real], 1.0, tol.sums_to_one(
        T, term=np.nansum(term, -1), size=np.nansum(np.abs(c), -1)).at(real))
    compact = capture(model, inputs, Options("compact", SINK_K, TAIL_W))
    parts = (np.nansum(compact["alpha"], -1) + np.nansum(compact["tail_alpha"], -1)
             + compact["middle_alpha"] + compact["learned_sink_alpha"])
    n = SINK_K + TAIL_W + 2                    # the middles are 1 less the rest: rounding only
    np.testing.assert_allclose(parts[real], 1.0, **tol.sums_to_one(n, depth=n))
    terms = [np.abs(compact["contribution"]), np.abs(compact["tail_contribution"])]
    summed = (np.nansum(compact["contribution"], -1) + np.nansum(compact["tail_contribution"], -1)
              + compact["middle_contribution"])
    size = sum(np.nansum(t, -1) for t in terms) + np.abs(compact["middle_contribution"])
    tol.assert_close(summed[real], 1.0, tol.sums_to_one(n, depth=n, size=size).at(real))


def test_removal_leaves_the_learned_sink_weight():
    """Faithfulness removal on gpt-oss: alpha over real keys is eager's (the learned sink keeps
    its share, no renormalisation; at layer 0, before any removal changed the inputs), and
    removing every real key leaves z = 0 (the sink carries no value)."""
    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits

    model, inputs = _model("gpt_oss"), ta.inputs("gpt_oss")
    _, calls = _reference("gpt_oss")
    T = calls[0].alpha.shape[-1]
    bound = tol.dot(tol.attention_terms(T=T, **model_dims(model)), vs=tol.F32)  # layer 0 alpha
    trace: list = []
    forward_logits(model, inputs, Intervener(model, Removal("attention", "comprehensiveness",
                                                            1.0), trace=trace))
    real = inputs["attention_mask"].bool().numpy()
    for t, call in zip(trace, calls):
        alpha = t["alpha"].numpy()                                   # (B, H, T, T) float64
        if t["layer"] == 0:
            tol.assert_close(np.where(real[:, None, :, None], alpha, np.nan),
                             np.where(real[:, None, :, None], call.alpha, np.nan), bound,
                             "clean alpha")
        assert (alpha.sum(-1)[real[:, None].repeat(4, 1)] < 1 - 1e-3).all()
        assert np.abs(t["z"].numpy()[real[:, None].repeat(4, 1)]).max() == 0.0


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


DECODERS = [n for n in ta.SUPPORTED if ta.ARCHS[n].kind == "decoder"]


@pytest.mark.parametrize("name", DECODERS)
def test_faithfulness_runs_on_every_decoder(name):
    """The removal handler's clean pass is the model itself (its own logits), and removing the
    top half of keys by contribution changes them: faithfulness runs on this decoder."""
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits

    model, inputs = _model(name), ta.inputs(name)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = model(**inputs, use_cache=False).logits[real]
    clean = forward_logits(model, inputs, Intervener(model))[real]
    scale = float(want.abs().max())
    np.testing.assert_allclose(clean.double().numpy(), want.double().numpy(), err_msg=name,
                               **forward_bound(model, inputs["input_ids"].shape[1], want))
    removed = forward_logits(model, inputs, Intervener(
        model, Removal("contribution", "comprehensiveness", 0.5)))[real]
    # the removal moves them by far more than rounding (not a tolerance)
    assert float((removed - want).abs().max()) > 1e-3 * max(1.0, scale), name


def coverage_rows() -> list[tuple[str, str, str]]:
    """(architecture, status, notes or reason) of every sweep entry, from the sweep's models."""
    rows = []
    for name, arch in ta.ARCHS.items():
        if arch.refused is None:
            found = discover(_model(name))
            kind = {"decoder": "exact, dense and compact; faithfulness", "encoder":
                    "exact, dense and compact", "vision": "exact, dense and compact"}[arch.kind]
            rows.append((name, kind, ", ".join(found.notes)))
        else:
            try:
                discover(ta.build(name))
                reason = "?"
            except Unsupported as exc:
                reason = str(exc)
            rows.append((name, "refused", reason))
    return rows


RESULTS = Path(__file__).resolve().with_name("archs_sweep.json")


def results(rows) -> dict:
    """The sweep's results file: its rows and the versions it ran with."""
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "rows": [dict(architecture=a, status=s, notes=n) for a, s, n in rows]}


def test_results_file_is_the_sweep():
    """tests/extract/archs_sweep.json holds this sweep's rows; rewrite it with ``python
    tests/extract/test_archs_sweep.py --write``."""
    import json

    recorded = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert recorded["rows"] == results(coverage_rows())["rows"], (
        "tests/extract/archs_sweep.json is stale: run python tests/extract/test_archs_sweep.py "
        "--write, then python docs/generate.py")


if __name__ == "__main__":                    # rewrite the results file from the sweep
    import json

    found = results(coverage_rows())
    if "--write" in sys.argv:
        RESULTS.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    for row in found["rows"]:
        print(row["architecture"], "|", row["status"], "|", row["notes"])
