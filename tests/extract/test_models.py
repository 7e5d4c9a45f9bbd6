"""Model loading helpers that need no model: the GGUF source digest and its cache."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from attngeom.extract.loading import models


def test_source_digest_is_the_files_sha256_and_is_remembered(tmp_path, monkeypatch):
    gguf, cached = tmp_path / "m.gguf", tmp_path / "cached"
    cached.mkdir()
    gguf.write_bytes(os.urandom(100_000))
    expected = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert models._source_digest(gguf, cached) == expected
    assert json.loads((cached / "attngeom-source.json").read_text())["sha256"] == expected

    def hashing_again(path):
        raise AssertionError("the remembered digest should have been used")

    monkeypatch.setattr(models, "_file_digest", hashing_again)
    assert models._source_digest(gguf, cached) == expected


def test_source_digest_is_recomputed_when_the_file_changes(tmp_path):
    gguf, cached = tmp_path / "m.gguf", tmp_path / "cached"
    cached.mkdir()
    gguf.write_bytes(b"a" * 1000)
    models._source_digest(gguf, cached)
    gguf.write_bytes(b"b" * 1001)
    assert models._source_digest(gguf, cached) == hashlib.sha256(b"b" * 1001).hexdigest()


@pytest.mark.parametrize("note", ["not json", "[1, 2]", '{"size": 1}'])
def test_source_digest_ignores_a_damaged_note(tmp_path, note):
    gguf, cached = tmp_path / "m.gguf", tmp_path / "cached"
    cached.mkdir()
    gguf.write_bytes(b"x" * 10)
    (cached / "attngeom-source.json").write_text(note)
    assert models._source_digest(gguf, cached) == hashlib.sha256(b"x" * 10).hexdigest()


def test_gguf_conversion_bar_follows_progress(capsys):
    """transformers converts a GGUF file under a plain tqdm bar that its own
    disable_progress_bar does not reach: shown only where progress is (not with --quiet)."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    with models._gguf_bar(False):
        list(gguf_utils.tqdm(range(3), desc="converting"))
    assert "converting" not in capsys.readouterr().err
    assert gguf_utils.tqdm is original
    with models._gguf_bar(True):
        list(gguf_utils.tqdm(range(3), desc="converting"))
    assert "converting" in capsys.readouterr().err
