"""extract --shard I/N, store merge, the content hash, and dask.distributed schedulers.

The session's tiny llama over 5 texts (tests/store/conftest.py): the part stores merged must be
the single-process store (same shard files, numbers and config_hash).
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest
import xarray as xr
from tiny_models import _WORDS, save_tiny

from attngeom.cli import main
from attngeom.extract.run import ExtractConfig, extract
from attngeom.store import open_store
from attngeom.analysis.scheduler import parse_scheduler, scheduler
from attngeom.store.format.parts import parse_part, shard_block
from attngeom.store.format.manifest import config_hash, read_manifest
from attngeom.store.errors import StoreError
from attngeom.store.ops.merge import merge
from attngeom.store.io.validate import validate

N_TEXTS, SHARD_SIZE = 5, 2                    # 3 shard files: [0,2) [2,4) [4,5)


def write_texts(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def random_texts(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS[:50]) for _ in range(rng.randint(3, 10)))
            for _ in range(n)]


def config(**kw):
    return ExtractConfig(**{"max_length": 12, "tail_w": 3, "shard_size": SHARD_SIZE, **kw})


@pytest.fixture(scope="module")
def ws(tmp_path_factory, model_dirs, texts_file):
    """The session's tiny llama and 5 texts (tests/store/conftest.py), one run and 2 parts."""
    root = tmp_path_factory.mktemp("shard")
    model, data = model_dirs["llama"], texts_file
    full = extract(str(model), str(data), root / "full", config(), progress=False)
    parts = [root / f"part{i}" for i in range(2)]
    for i, part in enumerate(parts):
        extract(str(model), str(data), part, config(), progress=False, shard=f"{i}/2")
    return {"root": root, "model": model, "data": data, "full": root / "full",
            "manifest": full, "parts": parts, "loaded": plain(root / "full")}


def plain(path):
    return open_store(path).drop_attrs().load()


def test_parts_are_contiguous_blocks_of_the_single_run_shards(ws):
    ranges = [[tuple(e["sequences"]) for e in read_manifest(p)["shards"]] for p in ws["parts"]]
    assert ranges == [[(0, 2)], [(2, 4), (4, 5)]]                # 3 shards over 2 parts
    assert [read_manifest(p)["part"]["sequences"] for p in ws["parts"]] == [[0, 2], [2, 5]]
    assert {read_manifest(p)["config_hash"] for p in ws["parts"]} == {ws["manifest"]["config_hash"]}
    assert list(shard_block(10, 0, 4)) == [0, 1] and list(shard_block(10, 3, 4)) == [7, 8, 9]
    assert sorted(i for k in range(4) for i in shard_block(10, k, 4)) == list(range(10))


def test_merge_of_parts_is_the_single_process_store(ws, tmp_path):
    out = tmp_path / "merged"
    m = merge(ws["parts"][::-1], out)                           # order does not matter
    full = ws["manifest"]
    assert m["config_hash"] == full["config_hash"] and m["config"] == full["config"]
    assert [(e["file"], e["sequences"], e["sha256"]) for e in m["shards"]] == \
        [(e["file"], e["sequences"], e["sha256"]) for e in full["shards"]]
    assert validate(out) == []
    assert (out / "README.txt").is_file()
    xr.testing.assert_identical(plain(out), ws["loaded"])
    name = "shards/shard-00000.nc"                               # hard-linked, not copied
    assert os.stat(out / name).st_ino == os.stat(ws["parts"][0] / name).st_ino


def test_merge_refuses_an_unfinished_input(ws, tmp_path):
    broken = shutil.copytree(ws["parts"][0], tmp_path / "broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    (broken / "manifest.json").write_text(json.dumps(dict(manifest, complete=False)))
    with pytest.raises(StoreError, match="incomplete store"):
        merge([broken, ws["parts"][1]], tmp_path / "out")


def test_merge_refuses_a_missing_part_and_other_options(ws, tmp_path):
    with pytest.raises(StoreError, match=r"sequences \[0, 2\).*--part 0/2"):
        merge([ws["parts"][1]], tmp_path / "a")
    other = extract(str(ws["model"]), str(ws["data"]), tmp_path / "w2", config(tail_w=2),
                    progress=False)
    assert other["config_hash"] != ws["manifest"]["config_hash"]
    with pytest.raises(StoreError, match="tail_w: 3 != 2"):
        merge([ws["full"], tmp_path / "w2"], tmp_path / "b")


def test_resuming_a_part_as_another_part_is_refused(ws):
    with pytest.raises(StoreError, match="--part 0/2, not --part 1/2"):
        extract(str(ws["model"]), str(ws["data"]), ws["parts"][0], config(), progress=False,
                shard="1/2")


def test_merge_with_no_text_is_what_a_no_text_run_records(ws, tmp_path):
    m = merge(ws["parts"], tmp_path / "merged", no_text=True)
    expected = json.loads(json.dumps(ws["manifest"]["config"]))
    expected["options"]["store_text"] = False                   # what extract --no-text records
    assert m["config"] == expected and m["config_hash"] == config_hash(expected)
    assert validate(tmp_path / "merged") == []
    merged = plain(tmp_path / "merged")
    assert "token" not in merged
    xr.testing.assert_identical(merged, ws["loaded"].drop_vars("token"))


def test_merge_of_different_data_renumbers_and_drops_duplicates(ws, tmp_path):
    first = ws["data"].read_text().splitlines()
    extra = random_texts(3, 1)
    texts = [extra[0], json.loads(first[3])["text"], extra[2]]  # the middle one is a duplicate
    data2 = write_texts(tmp_path / "more.jsonl", texts)
    extract(str(ws["model"]), str(data2), tmp_path / "s2", config(), progress=False)
    m = merge([ws["full"], tmp_path / "s2"], tmp_path / "merged")
    assert validate(tmp_path / "merged") == []
    assert m["n_sequences"] == N_TEXTS + 2
    parts = m["config"]["data"]["parts"]
    assert [p["text_offset"] for p in parts] == [0, N_TEXTS]
    assert parts[1]["dropped"] == [N_TEXTS + 1]
    merged, a, b = plain(tmp_path / "merged"), ws["loaded"], plain(tmp_path / "s2")
    assert merged["sequence"].values.tolist() == list(range(N_TEXTS + 2))
    assert merged["text_index"].values.tolist() == list(range(N_TEXTS)) + [N_TEXTS, N_TEXTS + 2]
    kept = b.isel(sequence=[0, 2]).assign_coords(sequence=[N_TEXTS, N_TEXTS + 1])
    tail = merged.isel(sequence=slice(N_TEXTS, None)).drop_vars("text_index")
    xr.testing.assert_identical(tail, kept.drop_vars("text_index"))
    xr.testing.assert_identical(merged.isel(sequence=slice(0, N_TEXTS)), a)


def test_content_hash_ignores_folders_and_changes_with_every_option(ws, tmp_path):
    model2 = shutil.copytree(ws["model"], tmp_path / "elsewhere" / ws["model"].name)
    data2 = shutil.copy(ws["data"], tmp_path / ws["data"].name)
    base = dict(limit=2, shard_size=None)
    h = lambda out, model=ws["model"], data=ws["data"], **kw: extract(   # noqa: E731
        str(model), str(data), tmp_path / out, config(**{**base, **kw}),
        progress=False)["config_hash"]
    ref = h("a")
    assert h("b", model=model2, data=data2) == ref               # same inputs, other folders
    assert "/" not in json.dumps(read_manifest(tmp_path / "b")["config"]["model"]["id"])
    variants = dict(mode="dense", sink_k=2, tail_w=2, max_length=10, limit=3, shard_size=1,
                    store_text=False, text_field="text")
    hashes = {name: h(name, **{name: value}) for name, value in variants.items()}
    assert ref not in hashes.values() and len(set(hashes.values())) == len(variants)
    other_weights = save_tiny("llama", tmp_path / "w" / ws["model"].name, seed=1)
    assert h("weights", model=other_weights) != ref


def test_cli_shard_and_merge(ws, tmp_path, capsys):
    assert main(["extract", "--model", str(ws["model"]), "--data", str(ws["data"]),
                 "--out", str(tmp_path / "p"), "--shard", "4/3", "--quiet"]) == 2
    assert "--part 4/3 is out of range" in capsys.readouterr().err          # --shard: alias
    rc = main(["store", "merge", *map(str, ws["parts"]), "--out", str(tmp_path / "m"), "--copy"])
    assert rc == 0 and "merged       from 2 store(s)" in capsys.readouterr().out
    name = "shards/shard-00000.nc"
    assert os.stat(tmp_path / "m" / name).st_ino != os.stat(ws["parts"][0] / name).st_ino
    assert validate(tmp_path / "m") == []
    assert main(["store", "merge", str(ws["parts"][1]), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "made with --part 0/2" in err


@pytest.mark.parametrize("spec", ["0/0", "3/3", "-1/2", "1", "a/b", "1/2/3"])
def test_bad_shard_specs(spec):
    with pytest.raises(ValueError, match="--part"):
        parse_part(spec)


@pytest.mark.parametrize("spec", ["local:0", "local:x", "cluster", "tcp://host", "tcp:/h:1"])
def test_bad_scheduler_specs(spec):
    with pytest.raises(ValueError, match="--scheduler"):
        parse_scheduler(spec)


def test_scheduler_specs():
    assert parse_scheduler("local:3") == ("local", 3)
    assert parse_scheduler("tcp://10.0.0.5:8786") == ("address", "tcp://10.0.0.5:8786")
    with scheduler(None) as client:
        assert client is None


def reduction(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """A few analysis-like reductions over sequences (contributions derived lazily)."""
    sink = ds["contribution"].isel(sink=0)
    return {"sink_contribution": sink.mean(("sequence", "query")).values,
            "output_norm": ds["output_norm"].median("query").sum("sequence").values,
            "tail": ds["tail_contribution"].sum("lag").std(("sequence", "query")).values,
            "alpha_q90": ds["alpha"].chunk({"sequence": -1}).quantile(0.9, "sequence").values}


def test_local_cluster_gives_the_local_result(ws):
    import dask

    ds = open_store(ws["full"])
    local = reduction(ds)
    with scheduler("local:2") as client:
        assert len(client.scheduler_info()["workers"]) == 2
        assert dask.base.get_scheduler() == client.get         # computations go to the cluster
        remote = reduction(open_store(ws["full"]))
    assert dask.base.get_scheduler() != getattr(client, "get", None)
    for name in local:
        np.testing.assert_array_equal(remote[name], local[name], err_msg=name)
    assert np.isfinite(local["sink_contribution"]).all()
