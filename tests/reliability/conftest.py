"""Fixtures of the reliability tests: a tiny saved GQA llama and a JSONL of texts."""

from __future__ import annotations

from pathlib import Path

import pytest

import tiny_models as tm
from store_helpers import write_texts

N_WORDS = tuple(1 + (5 * i) % 14 for i in range(24))       # words per text (+ BOS in tokens)


@pytest.fixture(scope="session")
def rel_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def tiny_model(rel_dir) -> Path:
    """A tiny llama (4 query heads, 2 kv heads) with its tokenizer, saved with save_pretrained."""
    return tm.save_tiny("llama", rel_dir / "model")


@pytest.fixture(scope="session")
def texts(rel_dir) -> Path:
    """24 texts of 1-14 words (some cut at --max-length 10), then one whitespace-only text."""
    path = write_texts(rel_dir / "texts.jsonl", N_WORDS)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"id": 40, "text": "   "}\n')
    return path


def _small_store(tiny_model: Path, rel_dir: Path, name: str, **options) -> Path:
    """Five texts (3, 9, 5, 1, 7 words; one cut at max_length 8) extracted in 3 shard files."""
    from attngeom.extract.run import ExtractConfig, extract

    data = write_texts(rel_dir / f"{name}.jsonl", (3, 9, 5, 1, 7))
    store = rel_dir / f"{name}-store"
    extract(str(tiny_model), str(data), store,
            ExtractConfig(max_length=8, shard_size=2, batch_size=2, **options), progress=False)
    return store


@pytest.fixture(scope="session")
def small_store(tiny_model, rel_dir) -> Path:
    """A valid compact store: tiny llama, 5 texts (one cut at max_length 8), 3 shard files."""
    return _small_store(tiny_model, rel_dir, "small", mode="compact", sink_k=1, tail_w=3)


@pytest.fixture(scope="session")
def small_dense_store(tiny_model, rel_dir) -> Path:
    """The small store's texts in the dense layout (every query x key pair kept)."""
    return _small_store(tiny_model, rel_dir, "small-dense", mode="dense")
