"""``attngeom store subset``: a smaller store to send, same schema and provenance."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from . import schema as S
from .manifest import StoreError, new_manifest, write_manifest
from .ops import (READ_NEEDS, _output_config, complete_manifest, finish, load_shard,
                  prepare_out, write_entry)


def parse_ranges(spec, available: Sequence[int], what: str) -> list[int]:
    """``"0:4,7"`` (half-open ranges and numbers; ``"2:"`` and ``":3"`` too) -> sorted labels."""
    available = [int(a) for a in available]
    if spec is None:
        return available
    if isinstance(spec, (list, tuple, range, np.ndarray)):
        values = [int(v) for v in spec]
    else:
        values = []
        for item in str(spec).split(","):
            m = re.fullmatch(r"\s*(\d*)\s*(:)?\s*(\d*)\s*", item)
            if not m or not (m.group(1) or m.group(3)) or (not m.group(2) and not m.group(1)):
                raise ValueError(f"{what} '{spec}': use numbers and half-open ranges, e.g. 0:4,7")
            lo = int(m.group(1)) if m.group(1) else 0
            hi = int(m.group(3)) if m.group(3) else (max(available) + 1 if m.group(2) else lo + 1)
            values += list(range(lo, hi))
    have = set(available)
    bad = [v for v in values if v not in have]
    if bad:
        raise ValueError(f"{what} {bad[0]} is not in the store (it has {_runs_text(available)})")
    if not values:
        raise ValueError(f"{what} '{spec}' selects nothing")
    return sorted(set(values))


def runs(values: Sequence[int]) -> list[list[int]]:
    """Sorted integers as half-open runs [[lo, hi), ...]."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([int(v), int(v) + 1])
    return out


def _runs_text(values: Sequence[int]) -> str:
    return ",".join(f"{a}" if b == a + 1 else f"{a}:{b}" for a, b in runs(sorted(values)))


def _expand(rs: list[list[int]]) -> list[int]:
    return [v for lo, hi in rs for v in range(lo, hi)]


def _variables(spec, present: set[str], mode: str) -> tuple[set[str], list[str]]:
    """The measured variables to keep, and those added so contributions derive on read."""
    measured = set(S.variables_for(mode, learned_sinks=True)) & present  # sinks if stored
    if spec is None:
        return measured, []
    names = [n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    always = set(S.SEQUENCE_VARIABLES) | {"token"}
    derived = set(S.DERIVED) if mode == "compact" else set(S.DERIVED_PAIR_VARIABLES)
    bad = [n for n in names if n not in measured | derived | always]
    if bad:
        raise ValueError(f"--variables {bad[0]} is not in the store; choose from "
                         f"{', '.join(sorted(measured | derived))}")
    keep = {n for n in names if n in measured}
    keep |= {"tail_alpha" if n.startswith("tail_") else "alpha" for n in names if n in derived}
    asked = set(keep)
    for name, needs in READ_NEEDS.items():
        if name in keep:
            keep |= set(needs)
    return keep, sorted(keep - asked)


def subset(store: str | Path, out: str | Path, layers=None, heads=None, sequences=None,
           variables=None, no_text: bool = False) -> dict:
    """Write the smaller store ``out`` cut from ``store``; return its manifest.

    ``layers``/``heads`` select by label (a subset of a subset keeps the model's numbers),
    ``sequences`` by the store's sequence index (renumbered 0..n-1 in the output), as lists or
    range strings like ``"0:4,7"``; ``variables`` names measured or derived variables
    (per-sequence variables are always kept).
    """
    src, out = Path(store), Path(out)
    m = complete_manifest(src)
    entries = sorted(m["shards"], key=lambda e: e["sequences"][0])
    if not entries:
        raise StoreError(f"{src}: the store holds no extracted sequences (only faithfulness "
                         "results?), so there is nothing to cut; send it as it is")
    with xr.open_dataset(src / entries[0]["file"], engine="h5netcdf") as first:
        layer_labels, head_labels = first[S.LAYER].values, first[S.HEAD].values
        present = set(first.data_vars)
    cfg = m["config"]
    layer_sel = parse_ranges(layers, layer_labels, "--layers")
    head_sel = parse_ranges(heads, head_labels, "--heads")
    seq_all = [s for e in entries for s in range(*e["sequences"])]
    seq_sel = parse_ranges(sequences, seq_all, "--sequences")
    keep, added = _variables(variables, present, cfg["options"]["mode"])
    before = cfg.get("subset") or {}
    origin = _expand(before["sequences"]) if before else list(range(m["n_sequences"]))
    position = {s: i for i, s in enumerate(seq_all)}
    dropped = sorted(set(before.get("dropped_variables", []))
                     | (set(S.variables_for(cfg["options"]["mode"], True)) & present) - keep)
    config = _output_config(cfg, no_text)
    config["subset"] = {
        "source_config_hash": before.get("source_config_hash", m["config_hash"]),
        "layers": [int(v) for v in layer_sel], "heads": [int(v) for v in head_sel],
        "n_sequences": len(seq_sel), "sequences": runs([origin[position[s]] for s in seq_sel]),
        "dropped_variables": dropped, "added_for_derived": added, "no_text": bool(no_text),
        "faithfulness_kept_whole": sorted(m.get("faithfulness") or {})}
    prepare_out(out, [src])
    extra = {k: m[k] for k in ("versions", "sources") if k in m}
    extra["counts"] = {"skipped_empty": m.get("counts", {}).get("skipped_empty", 0)}
    manifest = new_manifest(config, len(seq_sel), extra)
    write_manifest(out, manifest)
    drop = [n for n in present if n in set(dropped)]
    start, index = 0, 0
    for e in entries:
        lo, hi = e["sequences"]
        mine = [s for s in seq_sel if lo <= s < hi]
        if not mine:
            continue
        ds = load_shard(src / e["file"], lambda d, mine=mine: d.drop_vars(drop).sel(
            {S.SEQUENCE: mine, S.LAYER: layer_sel, S.HEAD: head_sel}))
        manifest["shards"].append(write_entry(ds, out, index, start, manifest, no_text))
        write_manifest(out, manifest)
        start, index = start + len(mine), index + 1
    return finish(out, manifest, [(src, m)])   # faithfulness results: whole experiments
