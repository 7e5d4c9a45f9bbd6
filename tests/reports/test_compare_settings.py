"""`attngeom compare` flags every setting that changes a column and tells like rows apart.

Two stores of the same texts and model that differ in ``--max-length`` (12 and 8: the sink
rate and Gu's share depend on the length) and ``--sink-k`` (1 and 2), and a copy of the first
(nothing differs but the folder).
"""

from __future__ import annotations

import shutil

import pytest

from attngeom.analysis.compare import DEPENDS, compare
from attngeom.cli import main


@pytest.fixture(scope="module")
def stores(tiny, tmp_path_factory):
    from attngeom.extract.run import ExtractConfig, extract

    root = tmp_path_factory.mktemp("compare-settings")
    out = {}
    for name, length, k in (("long", 12, 1), ("short", 8, 2)):
        out[name] = root / name
        extract(str(tiny["model"]), str(tiny["data"]), out[name],
                ExtractConfig(mode="compact", max_length=length, sink_k=k, tail_w=3),
                progress=False)
        assert main(["analyze", str(out[name]), "--out", str(out[name] / "analysis"),
                     "--no-progress", "--bootstrap", "0"]) == 0
    out["copy"] = root / "copy"
    shutil.copytree(out["long"], out["copy"])
    return out


def test_the_length_and_the_token_counts_are_flagged(stores):
    ds = compare([stores["long"], stores["short"]])
    assert list(ds["max_length"].values) == [12, 8]
    assert ds["tokens_per_sequence"].values[0] > ds["tokens_per_sequence"].values[1]
    for name in ("sink_head_share", "gu_sink_head_share", "convex_share",
                 "anti_aligned_share", "pooled_lmg_share"):
        flagged = ds[name].attrs["differs"].split(", ")
        assert {"max_length", "tokens_per_sequence", "sink_k"} <= set(flagged), (name, flagged)
    assert "data_sha256" not in ds.attrs["differs"]          # the same texts


def test_rows_that_would_share_a_label_are_told_apart(stores):
    ds = compare([stores["long"], stores["short"], stores["copy"]])
    labels = list(ds["label"].values)
    assert len(set(labels)) == 3, labels
    assert "max_length 12" in labels[0] and "sink_k 1" in labels[0]
    assert "max_length 8" in labels[1] and "sink_k 2" in labels[1]
    assert compare([stores["long"], stores["copy"]])["label"].values[1].endswith("(copy)")
    given = compare([stores["long"], stores["short"]], labels=["a", "b"])
    assert list(given["label"].values) == ["a", "b"]           # the user's labels are kept


def test_every_section_depends_on_what_was_measured():
    for section, settings in DEPENDS.items():
        assert {"max_length", "dtype"} <= set(settings), section
