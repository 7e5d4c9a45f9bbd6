"""Store operations: merge stores into one (here), cut a smaller one out (store/ops/subset.py).

merge
    Stores of the same model and options (everything in ``config`` but ``data`` and
    ``options.shard_size``; a different setting is refused, naming it). Stores with equal
    ``config_hash`` (the parts of ``extract --part I/N``, or copies) are one dataset: their
    shard files are hard-linked (copied across filesystems) under their own sequence ranges,
    duplicates of a shard kept once, and together they must cover every sequence; the
    result is the single-process store (same config, ``config_hash`` and shard files).
    Stores of different data are concatenated in the order given, sequences renumbered,
    ``text_index`` shifted into the concatenated data; a sequence whose token ids equal
    those of a sequence of an earlier input is dropped (recorded in ``data.parts``), and a
    later input whose data has the same sha256 as an earlier one is skipped whole.
subset
    Layers, heads (by their labels), sequences (renumbered 0..n-1; ``text_index`` kept) and
    variables; what was cut is recorded in ``config["subset"]`` (so the hash changes).

Faithfulness results (``<name>.nc`` recorded under ``manifest["faithfulness"]``) are
whole experiments: both copy them unchanged (checksums verified). merge refuses two inputs
holding different results under one name, and accepts results-only stores (``attngeom
faithfulness --out NEW``) of the same model, alone or next to extraction stores.

Both honour ``no_text`` (leave token strings out; ``options.store_text`` becomes false),
write a complete manifest, every shard with its sha256, and README.txt.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np

from ..format import schema as S
from ..format.manifest import (canonical, carried, config_difference, config_hash,
                               file_sha256, read_complete, without_text)
from attngeom.common.errors import Refusal, StoreError
from ..io.results import conflict as results_conflict
from ..io.results import entries as result_entries
from ..io.results import is_faith_only
from ..format.shards import read_shard, renumbered
from ..io.writer import StoreWriter, results_only


# ---------------------------------------------------------------------------- merge
def _comparable(config: dict) -> dict:
    config = copy.deepcopy(config)
    config.pop("data", None)
    config["options"].pop("shard_size", None)
    return config


def _groups(stores: list[Path], manifests: list[dict], no_text: bool) -> list[dict]:
    """Inputs grouped by output config hash (one dataset each), in order of appearance."""
    ref = _comparable(without_text(manifests[0]["config"], no_text))
    groups: dict[str, dict] = {}
    for store, m in zip(stores, manifests):
        cfg = without_text(m["config"], no_text)
        diff = config_difference(ref, _comparable(cfg))
        if diff:
            raise StoreError(f"cannot merge {store} with {stores[0]}: made with other settings "
                             f"({diff[:160]}); only stores of the same model and options merge")
        g = groups.setdefault(config_hash(cfg), {"config": cfg, "members": []})
        g["members"].append((store, m))
    return list(groups.values())


def _union(group: dict) -> list[tuple[Path, dict]]:
    """The group's shards in sequence order, each range once; all sequences covered."""
    entries = sorted(((tuple(e["sequences"]), store, e) for store, m in group["members"]
                      for e in m["shards"]), key=lambda t: t[0])
    kept: list[tuple[tuple, Path, dict]] = []
    for rng, store, e in entries:
        if kept and kept[-1][0] == rng:
            continue                                   # the same shard from another input
        if kept and rng[0] < kept[-1][0][1]:
            raise StoreError(f"{store}: {e['file']} overlaps sequences of {kept[-1][1]} "
                             "with other boundaries; merge stores made with the same options")
        kept.append((rng, store, e))
    n, expected = group["members"][0][1]["n_sequences"], 0
    for rng, _, _ in kept + [((n, n), None, None)]:
        if rng[0] > expected:
            raise StoreError(f"cannot merge: sequences [{expected}, {rng[0]}) of "
                             f"{group['config']['data'].get('spec')} are in none of the stores"
                             f"{_missing_parts(group)}")
        expected = max(expected, rng[1])
    return [(store, e) for _, store, e in kept]


def _missing_parts(group: dict) -> str:
    parts = [m.get("part") for _, m in group["members"] if m.get("part")]
    if not parts:
        return "; add the store that holds them"
    have = {p["index"] for p in parts}
    missing = [f"--part {i}/{parts[0]['count']}" for i in range(parts[0]["count"])
               if i not in have]
    return f"; add the part store(s) made with {', '.join(missing)}" if missing else ""


def merge(stores: Sequence[str | Path], out: str | Path, copy_files: bool = False,
          no_text: bool = False) -> dict:
    """Merge ``stores`` into the new store ``out``; return its manifest (see module doc)."""
    stores = [Path(s) for s in stores]
    if not stores:
        raise Refusal("store merge needs at least one input store")
    out = Path(out)
    manifests = [read_complete(s) for s in stores]
    results = list(zip(stores, manifests))             # faithfulness results travel along
    why = results_conflict(results)
    if why:
        raise StoreError(f"cannot merge: {why}")
    stores, manifests = _extractions(stores, manifests)
    if not stores:
        return _merge_results_only(results, out)
    groups = _groups(stores, manifests, no_text)
    for g in groups:
        g["shards"] = _union(g)
    kept, skipped = [groups[0]], []
    for g in groups[1:]:                           # the same texts again: a duplicate input
        same = [k for k in kept if k["config"]["data"]["sha256"] == g["config"]["data"]["sha256"]]
        (skipped if same else kept).append(g)
    record = {"inputs": [{"store": str(s), "config_hash": m["config_hash"],
                          "n_sequences": m["n_sequences"], "part": m.get("part")}
                         for s, m in zip(stores, manifests)],
              "skipped_duplicate_data": [m["config_hash"] for g in skipped
                                         for _, m in g["members"]]}
    if len(kept) == 1:
        return _merge_one(kept[0], out, copy_files, no_text, record, results, stores)
    return _merge_many(kept, out, no_text, record, results, stores)


def _extractions(stores: list[Path], manifests: list[dict]) -> tuple[list, list]:
    """The inputs holding extracted sequences; results-only inputs must share their model."""
    both = [(s, m) for s, m in zip(stores, manifests) if not is_faith_only(m)]
    for store, m in zip(stores, manifests):
        if both and is_faith_only(m):
            diff = _model_difference(both[0][1], m)
            if diff:
                raise StoreError(f"cannot merge {store} with {both[0][0]}: another model "
                                 f"(model.{diff[:160]}); only results of the same model merge")
    return [s for s, _ in both], [m for _, m in both]


def _model_difference(a: dict, b: dict) -> str | None:
    """'key: a != b' when two manifests name other weights or dtype (ids may be paths)."""
    keep = ("weight_fingerprint", "dtype", "n_layers", "n_heads")
    return config_difference({k: a["config"]["model"].get(k) for k in keep},
                             {k: b["config"]["model"].get(k) for k in keep})


def _merge_results_only(results: list[tuple[Path, dict]], out: Path) -> dict:
    """Stores that hold faithfulness results only: one such store with all of them."""
    first = results[0][1]
    for store, m in results[1:]:
        diff = _model_difference(first, m)
        if diff:
            raise StoreError(f"cannot merge {store} with {results[0][0]}: another model "
                             f"(model.{diff[:160]}); only results of the same model merge")
    names = {n: e.get("config_hash") for _, m in results for n, e in result_entries(m).items()}
    writer = results_only(out, first["config"]["model"], {"spec": "faithfulness results"},
                          dict(sorted(names.items())),
                          {"versions": first.get("versions", {}),
                           "merge": {"inputs": [str(s) for s, _ in results]}},
                          inputs=[s for s, _ in results])
    return writer.finish(results)


def _merge_one(group: dict, out: Path, copy_files: bool, no_text: bool, record: dict,
               results: list, inputs: list[Path]) -> dict:
    """Parts of one dataset: shard files linked (or rewritten without text) in place."""
    first = group["members"][0][1]
    writer = StoreWriter.new(out, group["config"], first["n_sequences"],
                             dict(carried(first), merge=record), inputs)
    hashes = {store: m["config_hash"] for store, m in group["members"]}
    for index, (store, e) in enumerate(group["shards"]):
        if hashes[store] == writer.config_hash:
            writer.add_file(store / e["file"], e, index, copy=copy_files)
        else:                                          # --no-text: rewritten without tokens
            ds = read_shard(_verified(store, e))
            writer.add_shard(renumbered(ds, e["sequences"][0], no_text), index)
    return writer.finish(results)


def _verified(store: Path, entry: dict) -> Path:
    src = store / entry["file"]
    if file_sha256(src) != entry["sha256"]:
        raise StoreError(f"{src}: checksum mismatch (damaged); run `attngeom store "
                         "validate` and re-extract that shard")
    return src


def _token_keys(path: Path) -> tuple[list[bytes], np.ndarray]:
    import h5netcdf

    with h5netcdf.File(path, "r") as f:
        ids = np.asarray(f.variables["token_id"][:])
        lengths = np.asarray(f.variables["length"][:])
        text_index = np.asarray(f.variables["text_index"][:])
    keys = [hashlib.sha256(ids[i, :n].astype(np.int64).tobytes()).digest()
            for i, n in enumerate(lengths)]
    return keys, text_index


def _data_parts(data: dict, offset: int) -> list[dict]:
    """A group's data as flat parts, ``text_offset`` shifted by ``offset``."""
    parts = data.get("parts") or [{k: data.get(k) for k in
                                   ("spec", "sha256", "n_texts", "text_field", "limit")}]
    return [dict(p, text_offset=offset + p.get("text_offset", 0),
                 dropped=[offset + t for t in p.get("dropped", [])]) for p in parts]


def _merge_many(groups: list[dict], out: Path, no_text: bool, record: dict,
                results: list, inputs: list[Path]) -> dict:
    """Different datasets: concatenate, renumber, drop sequences seen in an earlier input."""
    seen: set[bytes] = set()
    plan, parts, offset = [], [], 0
    for gi, g in enumerate(groups):
        parts += _data_parts(g["config"]["data"], offset)
        new: set[bytes] = set()
        for store, e in g["shards"]:
            keys, text_index = _token_keys(store / e["file"])
            keep = np.array([gi == 0 or k not in seen for k in keys], dtype=bool)
            for t in text_index[~keep]:
                part = next(p for p in parts if p["text_offset"] <= offset + t
                            < p["text_offset"] + p["n_texts"])
                part["dropped"].append(int(offset + t))
            new.update(keys)
            plan.append((store / e["file"], keep, offset))
        seen |= new
        offset += g["config"]["data"]["n_texts"]
    config = _merged_config(groups, parts, offset)
    members = [m for g in groups for _, m in g["members"]]
    extra = {"versions": members[0].get("versions", {}), "merge": record,
             "counts": {"skipped_empty": sum(g["members"][0][1].get("counts", {})
                                             .get("skipped_empty", 0) for g in groups)}}
    n = int(sum(keep.sum() for _, keep, _ in plan))
    writer = StoreWriter.new(out, config, n, extra, inputs)
    start, index = 0, 0
    for path, keep, text_offset in plan:
        if not keep.any():
            continue
        ds = read_shard(path, lambda d, k=keep: d.isel({S.SEQUENCE: np.flatnonzero(k)}))
        ds["text_index"] = ds["text_index"] + np.int32(text_offset)
        writer.add_shard(renumbered(ds, start, no_text), index)
        start, index = start + int(keep.sum()), index + 1
    return writer.finish(results)


def _merged_config(groups: list[dict], parts: list[dict], n_texts: int) -> dict:
    config = copy.deepcopy(groups[0]["config"])
    sizes = {g["config"]["options"].get("shard_size") for g in groups}
    config["options"]["shard_size"] = sizes.pop() if len(sizes) == 1 else None
    fields = {p.get("text_field") for p in parts}
    config["data"] = {
        "spec": "merge: " + " + ".join(str(p["spec"]) for p in parts),
        "text_field": fields.pop() if len(fields) == 1 else None,
        "sha256": hashlib.sha256(canonical([[p["sha256"], p["text_offset"], p["dropped"]]
                                            for p in parts]).encode()).hexdigest(),
        "n_texts": n_texts, "limit": None, "parts": parts}
    return config

