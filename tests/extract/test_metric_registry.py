"""The metric registry (attngeom/common/metrics.py): every entry's float32 and float64 kernels
against a model-space reference written here from MISSION.md's definitions, the copy rules it
drives, and a metric a user registers running through `attngeom faithfulness --metrics`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xarray as xr

import tiny_models as tm
import tolerance as tol
import user_metric
from store_helpers import score_size
from attngeom.cli import main as cli_main
from attngeom.extract.faithfulness.base import exact_z
from attngeom.extract.faithfulness.layer_scores import fast_scores, metric_scores
from attngeom.extract.faithfulness.experiment import plan_notes, ranking_plan
from attngeom.extract.faithfulness.removal_scores import logit_scale
from attngeom.extract.measurement.geometry import Projection
from attngeom.store.format import metrics as M


def _reference(metric, alpha, v, w_o):
    """Model space, float64, no Gram identities: v~_j^h = v_j^h W_O^h built explicitly."""
    B, H, T, Tk = alpha.shape
    dh = v.shape[-1]
    blocks = w_o.view(H, dh, -1)                                   # W_O^h (H, dh, d)
    vt = torch.einsum("bhkd,hde->bhke", v, blocks)                 # v~ (B, H, Tk, d)
    o_h = torch.einsum("bhqk,bhke->bhqe", alpha, vt)               # o_i^h
    o = o_h.sum(1)                                                 # o_i (B, T, d)
    norm_v = vt.norm(dim=-1)[:, :, None, :]
    ref = {
        "attention": alpha,
        "value_weighted": alpha * norm_v,
        "value_weighted_normalized": alpha * norm_v / o_h.norm(dim=-1)[..., None],
        "contribution": alpha * torch.einsum("bhqe,bhke->bhqk", o_h, vt)
        / o_h.norm(dim=-1)[..., None] ** 2,
        "contribution_layer": alpha * torch.einsum("bqe,bhke->bhqk", o, vt)
        / o.norm(dim=-1)[:, None, :, None] ** 2,
    }
    return ref[metric]


def _layer(seed=0, B=2, H=4, G=2, T=9, dh=8, d=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, dh, generator=g)
    k = torch.randn(B, G, T, dh, generator=g)
    v = torch.randn(B, G, T, dh, generator=g)
    w_o = torch.randn(H * dh, d, generator=g) / d ** 0.5
    allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
    return q, k, v, w_o, allowed, dh ** -0.5


@pytest.mark.parametrize("metric", [m for m in M.BUILTIN if not M.get(m).needs])
def test_every_entry_matches_the_reference_in_float64_and_float32(metric):
    """(The metrics that need more than the layer's attention: tests/extract/
    test_field_scores.py, test_field_removal.py.)"""
    q, k, v, w_o, allowed, scale = _layer()
    H = q.shape[1]
    kf, vf = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
    logits = (q.double() @ kf.double().mT * scale).masked_fill(~allowed, float("-inf"))
    alpha = torch.softmax(logits, -1)
    p32 = Projection.from_weight(w_o, H)
    proj = Projection(weight=w_o.double(), gram=(w_o.double().view(H, -1, w_o.shape[1])
                                                 @ w_o.double().view(H, -1, w_o.shape[1]).mT),
                      full=w_o.double() @ w_o.double().T)
    exact = metric_scores(metric, alpha, vf.double(), exact_z(alpha, vf.double()), proj)
    want = _reference(metric, alpha, vf.double(), w_o.double())
    # the chain from alpha and v: attention_terms of this layer, sizes 2 alpha ||v~|| / ||o||
    B, H, T, dh = q.shape
    n = tol.attention_terms(d=w_o.shape[1], d_head=dh, heads=H, T=T)
    size = score_size(alpha.numpy(), vf.double().numpy(), w_o.double().numpy())
    tol.assert_close(exact.numpy(), want.numpy(), tol.dot(n, size, tol.F64, vs=tol.F64), metric)
    fast, error = fast_scores(metric, alpha.float(), v, p32,
                              logit_scale(q, k, scale))
    entry = M.get(metric)
    assert entry.error_unit > 0 and error.relative.shape == alpha.shape[:-1]
    tol.assert_close(fast.double().numpy(), want.numpy(), tol.dot(n, size, vs=tol.F64), metric)
    if entry.nonnegative:
        assert (exact >= 0).all()


def test_the_copy_rules_come_from_the_entries():
    plan = ranking_plan(M.BUILTIN, ("signed", "magnitude"), "head")
    for name in M.BUILTIN:
        entry = M.get(name)
        copied = plan[(name, "magnitude")]
        assert (copied[1] == "signed") == entry.nonnegative
    assert plan[("value_weighted_normalized", "signed")] == ("value_weighted", "signed")
    assert ranking_plan(("value_weighted_normalized",), ("signed",), "head")[
        ("value_weighted_normalized", "signed")] == ("value_weighted_normalized", "signed")
    notes = plan_notes(plan, "head")
    assert any("1/||o_i^h|| is constant" in n for n in notes)


def test_unknown_metric_is_one_line_naming_the_registered_ones():
    with pytest.raises(ValueError, match="unknown metric 'nope'; use one of attention, "):
        M.get("nope")


@pytest.fixture
def registered():
    M.register(user_metric.ENTRY)
    yield user_metric.ENTRY
    M.unregister(user_metric.ENTRY.name)


def test_a_registered_metric_runs_through_the_command(registered, tmp_path, capsys):
    tm.save_tiny("llama", tmp_path / "llama")
    texts = ["the cat sat on the mat and looked at the dog for a while",
             "a quick brown fox jumps over the lazy dog near the river bank"]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "store"
    rc = cli_main(["faithfulness", "--model", str(tmp_path / "llama"), "--data",
                   str(tmp_path / "t.jsonl"), "--out", str(out), "--metrics",
                   "attention,value_norm", "--fractions", "0.5", "--ranks", "signed,magnitude",
                   "--no-drift", "--quiet", "--batch-size", "2"])
    assert rc == 0, capsys.readouterr().err
    ds = xr.open_dataset(out / "faithfulness.nc", engine="h5netcdf").load()
    assert list(ds["metric"].values) == ["attention", "value_norm"]
    # non-negative, so its magnitude ranking is a copy of the signed one
    assert ds["same_ranking_as"].sel(metric="value_norm", rank="magnitude") == "value_norm/signed"
    assert np.isfinite(ds["ppl"].sel(metric="value_norm")).all()
    assert not np.allclose(ds["ppl"].sel(metric="value_norm"), ds["ppl"].sel(metric="attention"))
    assert "value_norm" in capsys.readouterr().out              # the stored order table


def test_a_metric_not_registered_is_refused_by_the_command(tmp_path, capsys):
    rc = cli_main(["faithfulness", "--model", "x", "--data", "x", "--out", str(tmp_path / "s"),
                   "--metrics", "attention,value_norm"])
    err = capsys.readouterr().err
    assert rc == 2 and "value_norm" in err and len(err.strip().splitlines()) == 1


def test_built_in_kernels_are_found_by_name_and_plugins_by_their_strings(registered):
    from attngeom.extract.faithfulness import kernels as K
    from attngeom.extract.faithfulness import removal_scores as R

    assert set(K.BUILTIN) == {m for m in M.names() if M.get(m).builtin}
    assert K.kernels("contribution").fast is R.fast_contribution       # grep finds the caller
    assert all(M.get(m).fast == M.get(m).exact == "" for m in K.BUILTIN)
    assert K.kernels("value_norm").fast is user_metric.fast_value_norm
    with pytest.raises(ValueError, match="names no kernels"):
        M.register(M.Metric("bare", "b", "bare", "bare", "b", "bare"))
