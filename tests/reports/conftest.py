"""Small real stores for the report tests, extracted from a tiny random llama (module-wide)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def _texts(n: int, seed: int = 5) -> list[str]:
    import tiny_models as tm

    rng = random.Random(seed)
    return [" ".join(rng.choice(tm._WORDS[:56]) for _ in range(rng.randint(8, 15)))
            for _ in range(n)]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny llama directory and a JSONL of texts."""
    import tiny_models as tm

    root = tmp_path_factory.mktemp("report-inputs")
    model = tm.save_tiny("llama", root / "llama")
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(10)))
    return {"model": model, "data": data, "root": root}


@pytest.fixture(scope="session")
def dense_store(tiny, tmp_path_factory):
    """Dense store with token text and a faithfulness result (with the drift pass)."""
    from attngeom.extract.faithfulness.experiment import FaithConfig, faithfulness
    from attngeom.extract.run import ExtractConfig, extract

    store = tmp_path_factory.mktemp("dense") / "store"
    extract(str(tiny["model"]), str(tiny["data"]), store,
            ExtractConfig(mode="dense", max_length=16, shard_size=4), progress=False)
    cfg = FaithConfig(metrics=("attention", "value_weighted", "value_weighted_normalized",
                               "contribution", "random"), ranks=("signed", "magnitude"),
                      fractions=(0.2, 0.5), max_length=16, block_size=5, batch_size=5)
    faithfulness(str(tiny["model"]), str(tiny["data"]), store, cfg, progress=False,
                 log=lambda m: None)
    return store


@pytest.fixture(scope="session")
def compact_store(tiny, tmp_path_factory):
    """Compact store without token strings and without faithfulness results."""
    from attngeom.extract.run import ExtractConfig, extract

    store = tmp_path_factory.mktemp("compact") / "store"
    extract(str(tiny["model"]), str(tiny["data"]), store,
            ExtractConfig(mode="compact", max_length=16, tail_w=4, store_text=False),
            progress=False)
    return store



@pytest.fixture(scope="session")
def text_compact_store(tiny, tmp_path_factory):
    """Compact store with token strings, two sink keys and a tail window of 3 (the view's)."""
    from attngeom.extract.run import ExtractConfig, extract

    store = tmp_path_factory.mktemp("compact-text") / "store"
    extract(str(tiny["model"]), str(tiny["data"]), store,
            ExtractConfig(mode="compact", max_length=16, sink_k=2, tail_w=3, shard_size=4),
            progress=False)
    return store


def _opened_and_plain(store):
    import view_reference

    from attngeom.store import open_store

    return store, open_store(store).load(), view_reference.plain(store)


@pytest.fixture(scope="session")
def compact_view_data(text_compact_store):
    """(path, opened and loaded by attngeom, read by plain xarray) of text_compact_store."""
    return _opened_and_plain(text_compact_store)


@pytest.fixture(scope="session")
def dense_view_data(dense_store):
    """(path, opened and loaded by attngeom, read by plain xarray) of dense_store."""
    return _opened_and_plain(dense_store)
