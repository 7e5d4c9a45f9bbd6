"""Architectures through the command line: tiny models saved as directories, extracted with
``attngeom extract --mode dense``, the stored numbers compared with the independent eager
reference (``reference.eager_measure``); refused architectures exit 2 with one line.

The processes run concurrently to keep the wall time down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import reference as ref
import tiny_archs as ta
import tolerance as tol
from store_helpers import (assert_same, measurement_bounds, model_dims, write_images,
                           write_texts)

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("gpt_oss", "modernbert")
IMAGES = ("dinov2_with_registers",)
REFUSED = ("bitnet", "bloom")
NAMES = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer", "value_norm",
         "output_norm", "residual_norm", "head_share", "layer_output_norm", "sink_value_cosine")


def _start(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}
    return subprocess.Popen([sys.executable, "-m", "attngeom", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("archs-cli")
    texts = write_texts(base / "texts.jsonl", (3, 9, 6))
    images = write_images(base / "images")
    procs = {}
    for name in TEXT + IMAGES + REFUSED:
        model = ta.save(name, base / name)
        data = images if name in IMAGES else texts
        procs[name] = _start("extract", "--model", model, "--data", data, "--out",
                             base / f"{name}-store", "--mode", "dense", "--max-length", "10",
                             "--quiet")
    done = {name: p.communicate(timeout=600) + (p.returncode,) for name, p in procs.items()}
    return base, images, done


def _reference(name: str, base: Path, ds, images: Path) -> dict:
    model = ta._model_class(name, ta.make_config(name)).from_pretrained(
        base / name, dtype=torch.float32).eval()
    if name in IMAGES:
        from transformers import AutoImageProcessor

        from PIL import Image

        proc = AutoImageProcessor.from_pretrained(base / name)
        files = sorted(images.glob("*.png"))
        inputs = {"pixel_values": proc(images=[Image.open(f).convert("RGB") for f in files],
                                       return_tensors="pt")["pixel_values"]}
    else:
        ids = ds["token_id"].values.astype(np.int64)
        mask = ids >= 0
        inputs = {"input_ids": torch.as_tensor(np.where(mask, ids, 0)),
                  "attention_mask": torch.as_tensor(mask.astype(np.int64))}
    return ref.eager_measure(model, inputs, ta.ARCHS[name].w_o)[0]


@pytest.mark.parametrize("name", TEXT + IMAGES)
def test_dense_store_equals_the_reference(runs, name):
    import attngeom.store

    base, images, done = runs
    out, err, rc = done[name]
    assert rc == 0, err[-2000:]
    ds = attngeom.store.open(base / f"{name}-store").load()
    r = _reference(name, base, ds, images)
    names = NAMES + (("learned_sink_alpha",) if name == "gpt_oss" else ())
    assert ("learned_sink_alpha" in ds) == (name == "gpt_oss")
    bound = measurement_bounds(r, model_dims(ta.make_config(name)))
    for n in names:
        assert_same(ds[n].values, r[n], f"{name} {n}", bound[n])
    if name in IMAGES:
        assert list(ds["token"].values[0][:4]) == ["[CLS]", "reg0", "reg1", "p(0,0)"]
        assert (ds["special"].values[:, :3] == 1).all() and (ds["special"].values[:, 3:] == 0).all()


@pytest.mark.parametrize("name", REFUSED)
def test_refused_exits_2_with_one_line(runs, name):
    base, _, done = runs
    out, err, rc = done[name]
    lines = [line for line in err.strip().splitlines() if not line.startswith("[transformers]")]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("attngeom: error: "), err
    assert ta.ARCHS[name].refused in lines[0]
    assert not (base / f"{name}-store").exists()


def test_learned_sinks_compact_store(tmp_path):
    """A compact gpt-oss store: learned_sink_alpha is stored, validated, described (store info,
    README.txt), the groups with the learned sink sum to one, and the sink analysis and report
    page read it."""
    import attngeom.store
    from attngeom.analysis import sinks
    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.reports.figures.sinks import learned_sink_pages
    from attngeom.store.ops.info import summary
    from attngeom.store.io.validate import validate

    model = ta.save("gpt_oss", tmp_path / "model")
    texts = write_texts(tmp_path / "texts.jsonl", (3, 12, 6))
    store = tmp_path / "store"
    extract(str(model), str(texts), store, ExtractConfig(max_length=12, tail_w=3),
            progress=False)
    assert validate(store) == []
    assert "learned sinks (learned_sink_alpha stored)" in summary(store)
    assert "learned_sink_alpha  (sequence, layer, head, query)" in (store / "README.txt").read_text()
    ds = attngeom.store.open(store).load()
    total = (ds["alpha"].sum("sink") + ds["tail_alpha"].fillna(0).sum("lag")
             + ds["middle_alpha"] + ds["learned_sink_alpha"]).values
    real = ~np.isnan(ds["output_norm"].values)
    n = ds.sizes["sink"] + ds.sizes["lag"] + 2         # the middle is 1 less the rest: rounding
    np.testing.assert_allclose(total[real], 1.0, **tol.sums_to_one(n, depth=n))
    s = sinks(ds)
    lsa = np.where(real, ds["learned_sink_alpha"].values, np.nan)[..., 1:]     # queries i >= 1
    want = np.nanmean(np.moveaxis(lsa, 0, -1).reshape(2, 4, -1), -1)          # (layer, head)
    count = int((~np.isnan(lsa[:, 0, 0])).sum())
    # both are means of float32 values summed in float32 (xarray's and numpy's nanmean), in
    # orders that depend on the CPU's vector width: each within gamma(count) of the exact mean
    np.testing.assert_allclose(s["learned_sink_rate_mean"].values, want,
                               **tol.total(count, np.nanmax(want), tol.F32, vs=tol.F32))
    from attngeom.reports.style import style

    with style():
        assert len(learned_sink_pages(s)) == 1
    assert learned_sink_pages(sinks(ds.drop_vars("learned_sink_alpha"))) == []
