"""``attngeom store subset``: a smaller store to send, same schema and provenance."""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from ..format import schema as S
from ..format.manifest import carried, read_complete, without_text
from attngeom.common.errors import Refusal, StoreError
from attngeom.common.options.ranges import expand, parse_ranges, runs
from ..format.shards import read_shard, renumbered
from ..io.writer import StoreWriter

READ_NEEDS = {  # what attngeom.store.open needs to derive contributions on read
    "alpha": ("value_norm", "cosine", "cosine_layer", "output_norm", "layer_output_norm"),
    "tail_alpha": ("value_norm", "tail_cosine", "tail_cosine_layer", "output_norm",
                   "layer_output_norm"),
}


def _select(spec, available, what: str) -> list[int]:
    """:func:`attngeom.common.options.ranges.parse_ranges` of the store's labels; None: all of
    them."""
    chosen = parse_ranges(spec, available, what)
    return [int(a) for a in available] if chosen is None else chosen


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
        raise Refusal(f"--variables {bad[0]} is not in the store; choose from "
                         f"{', '.join(sorted(measured | derived))}")
    keep = {n for n in names if n in measured}
    keep |= {"tail_alpha" if n.startswith("tail_") else "alpha" for n in names if n in derived}
    asked = set(keep)
    for name, needs in READ_NEEDS.items():
        if name in keep:
            keep |= set(needs)
    return keep, sorted(keep - asked)


def added_variables(manifest: dict) -> list[str]:
    """Variables a subset store kept although not asked for (contributions derive from them)."""
    return list((manifest["config"].get("subset") or {}).get("added_for_derived", []))


def subset(store: str | Path, out: str | Path, layers=None, heads=None, sequences=None,
           variables=None, no_text: bool = False) -> dict:
    """Write the smaller store ``out`` cut from ``store``; return its manifest.

    ``layers``/``heads`` select by label (a subset of a subset keeps the model's numbers),
    ``sequences`` by the store's sequence index (renumbered 0..n-1 in the output), as lists or
    range strings like ``"0:4,7"``; ``variables`` names measured or derived variables
    (per-sequence variables are always kept).
    """
    src, out = Path(store), Path(out)
    m = read_complete(src)
    entries = sorted(m["shards"], key=lambda e: e["sequences"][0])
    if not entries:
        raise StoreError(f"{src}: the store holds no extracted sequences (only faithfulness "
                         "results?), so there is nothing to cut; send it as it is")
    with xr.open_dataset(src / entries[0]["file"], engine="h5netcdf") as first:
        layer_labels, head_labels = first[S.LAYER].values, first[S.HEAD].values
        present = set(first.data_vars)
    cfg = m["config"]
    layer_sel = _select(layers, layer_labels, "--layers")
    head_sel = _select(heads, head_labels, "--heads")
    seq_all = [s for e in entries for s in range(*e["sequences"])]
    seq_sel = _select(sequences, seq_all, "--sequences")
    keep, added = _variables(variables, present, cfg["options"]["mode"])
    before = cfg.get("subset") or {}
    origin = expand(before["sequences"]) if before else list(range(m["n_sequences"]))
    position = {s: i for i, s in enumerate(seq_all)}
    dropped = sorted(set(before.get("dropped_variables", []))
                     | (set(S.variables_for(cfg["options"]["mode"], True)) & present) - keep)
    config = without_text(cfg, no_text)
    config["subset"] = {
        "source_config_hash": before.get("source_config_hash", m["config_hash"]),
        "layers": [int(v) for v in layer_sel], "heads": [int(v) for v in head_sel],
        "n_sequences": len(seq_sel), "sequences": runs([origin[position[s]] for s in seq_sel]),
        "dropped_variables": dropped, "added_for_derived": added, "no_text": bool(no_text),
        "faithfulness_kept_whole": sorted(m.get("faithfulness") or {})}
    writer = StoreWriter.new(out, config, len(seq_sel), carried(m), inputs=[src])
    drop = [n for n in present if n in set(dropped)]
    start, index = 0, 0
    for e in entries:
        lo, hi = e["sequences"]
        mine = [s for s in seq_sel if lo <= s < hi]
        if not mine:
            continue
        ds = read_shard(src / e["file"], lambda d, mine=mine: d.drop_vars(drop).sel(
            {S.SEQUENCE: mine, S.LAYER: layer_sel, S.HEAD: head_sel}))
        writer.add_shard(renumbered(ds, start, no_text), index)
        start, index = start + len(mine), index + 1
    return writer.finish([(src, m)])   # faithfulness results: whole experiments
