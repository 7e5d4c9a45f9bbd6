"""Stores of tiny saved models, extracted once per session, and their naive references.

``stores[(arch, mode)]`` (llama dense and compact, bert compact) is a complete store of 5 texts
(2 shards of 3 and 2 sequences, one text truncated at ``MAX_LENGTH``) made with ``SINK_K`` and
``TAIL_W``; dense stores use batches of 2 and compact ones batches of 1, so padding differs.
``reference_for(arch, ds)`` runs tests/reference.py on the token ids read back from a store.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

import tiny_models as tm
from store_helpers import load_tiny, reference_on_ids, write_texts

KINDS = (("llama", "dense"), ("llama", "compact"), ("bert", "compact"))  # GQA decoder, encoder
MAX_LENGTH, SINK_K, TAIL_W, SHARD_SIZE = 10, 2, 3, 3
N_WORDS = (3, 12, 6, 1, 8)         # + BOS (llama) or CLS/SEP (bert): text 1 is truncated


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stores")


@pytest.fixture(scope="session")
def texts_file(workdir) -> Path:
    return write_texts(workdir / "texts.jsonl", N_WORDS)


@pytest.fixture(scope="session")
def model_dirs(workdir) -> dict[str, Path]:
    return {arch: tm.save_tiny(arch, workdir / f"model-{arch}") for arch in dict(KINDS)}


@pytest.fixture(scope="session")
def stores(workdir, model_dirs, texts_file) -> dict[tuple[str, str], Path]:
    from attngeom.extract.run import ExtractConfig, extract

    made = {}
    for arch, mode in KINDS:
        out = workdir / f"store-{arch}-{mode}"
        cfg = ExtractConfig(mode=mode, sink_k=SINK_K, tail_w=TAIL_W, max_length=MAX_LENGTH,
                            shard_size=SHARD_SIZE, batch_size=2 if mode == "dense" else 1)
        extract(str(model_dirs[arch]), str(texts_file), out, cfg, progress=False)
        made[arch, mode] = out
    return made


@pytest.fixture(scope="session")
def opened(stores) -> dict:
    """Each session store opened with attngeom.store.open (derived variables on) and loaded."""
    from attngeom.store import open as open_store

    return {kind: open_store(path).load() for kind, path in stores.items()}


@pytest.fixture(scope="session")
def reference_for(model_dirs):
    """(arch, ds) -> naive reference (float64, S first) on the store's own token ids."""

    @functools.lru_cache(maxsize=None)
    def run(arch: str, ids_key: bytes) -> dict[str, np.ndarray]:
        ids = np.frombuffer(ids_key, dtype=np.int64).reshape(-1, MAX_LENGTH)
        return reference_on_ids(load_tiny(model_dirs[arch], arch), ids, SINK_K)

    def get(arch: str, ds) -> dict[str, np.ndarray]:
        ids = np.asarray(ds["token_id"].values, dtype=np.int64)
        return run(arch, ids.tobytes())

    return get


@pytest.fixture
def copy_store(stores, tmp_path):
    """A private copy of a session store, free to damage."""

    def make(arch: str = "llama", mode: str = "compact") -> Path:
        return Path(shutil.copytree(stores[arch, mode], tmp_path / f"{arch}-{mode}"))

    return make


@pytest.fixture(scope="session")
def layout() -> dict:
    """The options the session stores were made with."""
    return {"max_length": MAX_LENGTH, "sink_k": SINK_K, "tail_w": TAIL_W,
            "shard_size": SHARD_SIZE, "n_words": N_WORDS}


@pytest.fixture
def zlib_deflate(monkeypatch):
    """encode_chunk with zlib's deflate (what HDF5 itself uses), not ISA-L's: the byte-for-byte
    comparisons with HDF5's own chunks."""
    import zlib

    from attngeom.store.format import chunks

    monkeypatch.setattr(chunks, "deflate", lambda: zlib.compress)
