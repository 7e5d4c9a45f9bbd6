"""Gu et al.'s probe inputs (extract/loading/probes.py), --bos and --min-length, end to end
through `attngeom extract` on a tiny model: token ids drawn directly, recorded in the store."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tiny_models as tm
from attngeom.cli import main as cli_main
from attngeom.extract.loading.probes import Probe, parse_probe, probe_ids
from attngeom.store import open_store, read_manifest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    return tm.save_tiny("llama", root / "llama"), root


def test_probe_ids_are_non_special_uniform_and_reproducible():
    tok = tm.make_tokenizer("llama")
    special = set(tok.all_special_ids)
    a = probe_ids(Probe("random", 40, 50, seed=3), tok)
    assert a.shape == (50, 40) and not special & set(np.unique(a).tolist())
    assert (a == probe_ids(Probe("random", 40, 50, seed=3), tok)).all()
    assert not (a == probe_ids(Probe("random", 40, 50, seed=4), tok)).all()
    assert len(np.unique(a)) == len(tok) - len(special)            # the whole vocabulary
    r = probe_ids(Probe("repeated", 7, 5), tok)
    assert (r == r[:, :1]).all() and len(np.unique(r[:, 0])) > 1
    b = probe_ids(Probe("random", 40, 50, seed=3), tok, bos=True)
    assert (b[:, 0] == tok.bos_token_id).all() and (b[:, 1:] == a[:, :-1]).all()


@pytest.mark.parametrize("spec", ["probe:random:0:5", "probe:noise:8:5", "probe:random:8",
                                  "probe:random:8:5:x"])
def test_malformed_probe_specs_are_one_line_errors(spec):
    with pytest.raises(ValueError, match="malformed probe spec .* probe:random:T:N"):
        parse_probe(spec)


def test_a_probe_store_holds_exactly_the_drawn_ids(tiny, capsys):
    model, root = tiny
    out = root / "random-bos"
    rc = cli_main(["extract", "--model", str(model), "--data", "probe:random:12:6:2",
                   "--bos", "yes", "--max-length", "12", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    ds = open_store(out)
    want = probe_ids(Probe("random", 12, 6, 2), tm.make_tokenizer("llama"), bos=True)
    np.testing.assert_array_equal(ds["token_id"].values, want)
    data = read_manifest(out)["config"]["data"]
    assert data["spec"] == "probe:random:12:6:2" and data["bos"] == "yes"
    assert len(data["tokenizer_sha256"]) == 64 and data["n_texts"] == 6


def test_min_length_drops_short_texts_and_limit_counts_the_kept(tiny, capsys):
    model, root = tiny
    tok = tm.make_tokenizer("llama")
    words = tm._WORDS
    texts = [" ".join(words[:n]) for n in (3, 12, 4, 15, 20)]
    path = root / "mixed.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    out = root / "long"
    rc = cli_main(["extract", "--model", str(model), "--data", str(path), "--min-length", "10",
                   "--limit", "2", "--max-length", "10", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    keep = [t for t, n in zip(texts, lengths) if n >= 10][:2]
    ds = open_store(out)
    assert ds.sizes["sequence"] == 2 and (ds["length"].values == 10).all()
    np.testing.assert_array_equal(ds["token_id"].values,
                                  [tok(t)["input_ids"][:10] for t in keep])
    assert read_manifest(out)["config"]["data"]["min_length"] == 10
    rc = cli_main(["extract", "--model", str(model), "--data", str(path), "--min-length",
                   "99", "--out", str(root / "none"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "--min-length 99" in err[-1]
