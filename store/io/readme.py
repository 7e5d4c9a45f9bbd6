"""README.txt: a plain-text description inside every store, for collaborators without attngeom.

It lists each variable (definition from :mod:`attngeom.store.format.schema`, dims, units), the
layout (dense or compact, the sink and lag dims, the NaN convention), the provenance from
the manifest, and the few lines of plain xarray that open the store.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from attngeom.common.atomic import atomic_write_bytes
from attngeom.common.vocab import PACKED

from ..format import schema as S
from ..format.packing import KEEP_BITS, NORM_ERROR, PACKED_VARIABLES, ROUNDED_VARIABLES, precision_of
from .results import is_faith_only, readme_lines

README = "README.txt"

_NORM = "model units: L2 norm in the model's hidden space"
UNITS: dict[str, str] = {
    "alpha": "probability, 0..1", "cosine": "cosine, -1..1", "cosine_layer": "cosine, -1..1",
    "contribution": "fraction; sums to 1 over keys, can be negative",
    "contribution_layer": "fraction; sums to 1 over heads and keys, can be negative",
    "value_norm": _NORM, "output_norm": _NORM, "residual_norm": _NORM,
    "layer_output_norm": _NORM, "sink_value_cosine": "cosine, -1..1",
    "sink_residual_cosine": "cosine, -1..1", "head_share": "fraction; sums to 1 over heads",
    "learned_sink_alpha": "probability, 0..1", "middle_alpha": "probability mass, 0..1", "middle_contribution": "fraction",
    "middle_contribution_layer": "fraction", "middle_count": "number of keys",
    "token_id": "tokenizer id", "token": "text", "length": "tokens", "truncated": "flag 0/1",
    "finite": "flag 0/1", "text_index": "index", "special": "flag 0/1",
}

_OPEN = """\
    import glob
    import xarray as xr   # needs: pip install xarray h5netcdf dask

    files = sorted(glob.glob("STORE/shards/*.nc"))      # names sort in sequence order
    ds = xr.open_mfdataset(files, engine="h5netcdf", combine="nested",
                           concat_dim="sequence", data_vars="minimal", coords="minimal",
                           compat="override", join="override")
    # one file alone: xr.open_dataset("STORE/shards/shard-00000.nc", engine="h5netcdf")
"""
_DERIVE_DENSE = """\
    # contribution weights are derived on read (not stored):
    base = ds.alpha * ds.value_norm                      # value_norm on (..., key)
    contribution = base * ds.cosine / ds.output_norm
    contribution_layer = base * ds.cosine_layer / ds.layer_output_norm
"""
_DERIVE_COMPACT = """\
    # contribution weights are derived on read (not stored):
    vn = ds.value_norm.isel(key=slice(0, ds.sizes["sink"])).rename(key="sink")
    vn = vn.assign_coords(sink=ds.sink.values)
    contribution = ds.alpha * vn * ds.cosine / ds.output_norm          # sink keys
    contribution_layer = ds.alpha * vn * ds.cosine_layer / ds.layer_output_norm
    key = (ds["query"] - ds["lag"]).clip(min=0)                        # tail: key = query - lag
    tail_vn = ds.value_norm.drop_vars("key").isel(key=key.drop_vars(["query", "lag"]))
    tail_contribution = ds.tail_alpha * tail_vn * ds.tail_cosine / ds.output_norm
    tail_contribution_layer = (ds.tail_alpha * tail_vn * ds.tail_cosine_layer
                               / ds.layer_output_norm)
"""


def _units(name: str, precision: str = "float32") -> str:
    units = UNITS.get(name) or UNITS.get(name.removeprefix("tail_"), "")
    if precision == PACKED and name in PACKED_VARIABLES:
        p = PACKED_VARIABLES[name]
        units += (f"; int16 packed, step {float(p.scale_factor):.3g}, error <= "
                  f"{p.max_error:.3g}")
    elif precision == PACKED and name in ROUNDED_VARIABLES:
        units += f"; {KEEP_BITS} mantissa bits, relative error <= {NORM_ERROR:.3g}"
    return units


def _dims(name: str, mode: str, precision: str = "float32") -> tuple[str, ...]:
    if name in S.DIMS:
        return S.dims_for(name, mode, precision)
    dims = S.PAIR                                      # derived pair variables: (.., key)
    return S.SINK_PAIR if mode == "compact" else dims


def stored_variables(config: dict) -> list[str]:
    """Names of the variables a store's shards hold, given its (possibly cut) config."""
    opts, cut = config["options"], config.get("subset") or {}
    learned = config.get("model", {}).get("learned_sinks", False)
    names = S.variables_for(opts["mode"], learned) + ["token_id", "length", "truncated",
                                                      "finite", "text_index", "special"]
    if opts.get("store_text", True):
        names.append("token")
    dropped = set(cut.get("dropped_variables", []))
    return [n for n in names if n not in dropped]


def _variable_lines(config: dict) -> list[str]:
    mode, precision = config["options"]["mode"], precision_of(config["options"])
    lines = []
    for name in stored_variables(config):
        lines.append(f"  {name}  ({', '.join(_dims(name, mode, precision))})  "
                     f"[{_units(name, precision)}]")
        lines += textwrap.wrap(S.DESCRIPTIONS[name], 92, initial_indent="      ",
                               subsequent_indent="      ")
    return lines


def _layout_lines(config: dict) -> list[str]:
    o = config["options"]
    common = [
        "Dimensions: sequence (one text each, numbered 0..n-1), layer, head (query heads;",
        "with grouped-query attention several heads share a key/value head), position,",
        "query and key (token positions 0..max_length-1, padded).",
    ]
    if o["mode"] == "dense":
        layout = ["Layout: dense. Every (query, key) variable is stored whole on",
                  "(..., query, key)."]
    else:
        k, w = o["sink_k"], o["tail_w"]
        layout = [
            f"Layout: compact. (query, key) variables are kept only for the sink keys (key < {k})",
            "on the 'sink' dimension (coordinate sink = key position), and for a tail window of",
            f"the {w} most recent non-sink keys up to each query on the 'lag' dimension with a",
            "tail_ prefix (key = query - lag). Per-query totals over the remaining (middle) keys",
            "are the middle_* variables. Every per-key and per-query variable is kept in full.",
        ]
    nan = [
        "NaN: cells beyond a sequence's length, outside the attention mask (e.g. future keys",
        "of a causal model, keys outside a sliding window) or, in the tail window, falling on",
        "a sink key are NaN. token_id is -1 beyond length. Sequences with finite == 0 had",
        "non-finite activations and should be left out of statistics.",
    ]
    text = ([] if o.get("store_text", True) else
            ["Token strings were left out (--no-text); token_id and the tokenizer give them."])
    packed = _packed_lines(o["mode"]) if precision_of(o) == PACKED else []
    return (common + [""] + layout + [""] + nan + ([""] + text if text else [])
            + ([""] + packed if packed else []))


def _packed_lines(mode: str) -> list[str]:
    a, c = PACKED_VARIABLES["alpha"], PACKED_VARIABLES["cosine"]
    return [
        "Precision: packed. alpha, tail_alpha, middle_alpha (0..1) and every cosine (-1..1) are",
        "int16 with the CF attributes scale_factor and add_offset (value = add_offset +",
        "scale_factor * q; q = -32768, the _FillValue, is NaN): every netCDF reader decodes them",
        "(xarray does by default). Values were clipped to the range first. Quantisation error:",
        f"at most {a.max_error:.3g} for the alphas (step {float(a.scale_factor):.4g}) and "
        f"{c.max_error:.3g} for the cosines (step {float(c.scale_factor):.4g}),",
        "half a step plus float32 rounding. Norms, head_share and middle contributions are",
        f"float32 with mantissas rounded to {KEEP_BITS} bits (netCDF-C's BitRound; attribute",
        f"_QuantizeBitRoundNumberOfSignificantBits): relative error at most {NORM_ERROR:.3g}.",
        "Contributions derived from them differ from a float32 store's by at most",
        "  (value_norm / norm) * (|cosine| e_alpha + alpha e_cosine + e_alpha e_cosine)",
        f"  * (1 + 3 e_norm) + |contribution| * 2.01 e_norm     (e_norm = {NORM_ERROR:.3g}).",
    ] + ([
        "middle_count does not vary by head and is stored once per (sequence, layer, query);",
        "attngeom.store.open broadcasts it over heads.",
    ] if mode == "compact" else [])


def _provenance_lines(manifest: dict) -> list[str]:
    cfg = manifest["config"]
    m, d, o = cfg["model"], cfg["data"], cfg["options"]
    v = manifest.get("versions", {})
    lines = [
        f"content hash   {manifest['config_hash']}",
        "               (sha256 of the canonical JSON of manifest.json 'config': the same",
        "               model, weights, data and options always give the same hash)",
        f"model          {m.get('id')} ({m.get('architecture')}, {m.get('model_type')}, "
        f"{m.get('dtype')}), {m.get('n_layers')} layers x {m.get('n_heads')} heads "
        f"({m.get('n_kv_heads')} kv), {'causal' if m.get('causal') else 'bidirectional'}, "
        f"output bias {'yes (left out of o)' if m.get('output_bias') else 'no'}",
        f"weights        sha256 fingerprint {m.get('weight_fingerprint')}"
        + (f", revision {m['revision']}" if m.get("revision") else ""),
        f"data           {d.get('spec')}: {d.get('n_texts')} texts, sha256 {d.get('sha256')}",
        "options        " + ", ".join(f"{k}={o[k]}" for k in sorted(o)),
        f"sequences      {manifest['n_sequences']} in {len(manifest['shards'])} shard file(s)",
        f"created        {manifest.get('created')} with "
        + ", ".join(f"{k} {v[k]}" for k in sorted(v)),
    ]
    for part in d.get("parts", []):
        lines.append(f"  merged data  {part.get('spec')} ({part.get('n_texts')} texts, sha256 "
                     f"{str(part.get('sha256'))[:16]}), text_index from {part['text_offset']}"
                     + (f", {len(part['dropped'])} duplicate(s) dropped"
                        if part.get("dropped") else ""))
    if "part" in manifest:
        p = manifest["part"]
        lines.append(f"part           {p['index']}/{p['count']} of a sharded extraction: "
                     f"sequences [{p['sequences'][0]}, {p['sequences'][1]}) of "
                     f"{manifest['n_sequences']}; join all parts with `attngeom store merge`")
    cut = cfg.get("subset")
    if cut:
        lines.append(f"subset         of store {str(cut.get('source_config_hash'))[:16]}: layers "
                     f"{cut.get('layers')}, heads {cut.get('heads')}, "
                     f"{cut.get('n_sequences')} sequences"
                     + (f", without {', '.join(cut['dropped_variables'])}"
                        if cut.get("dropped_variables") else ""))
        lines.append("               sequences are renumbered 0..n-1; text_index still points "
                     "into the data")
    return lines


def readme_text(manifest: dict, store: str | Path | None = None) -> str:
    """The README.txt of the store described by ``manifest`` (at ``store``, if given)."""
    if is_faith_only(manifest):
        return _faith_only_text(manifest, store)
    cfg = manifest["config"]
    mode = cfg["options"]["mode"]
    derived = S.DERIVED if mode == "compact" else tuple(S.DERIVED_PAIR_VARIABLES)
    derived_lines = [f"  {n}  ({', '.join(_dims(n, mode))})  [{_units(n)}]"
                     f"\n      {S.DESCRIPTIONS[n]}" for n in derived]
    out = [
        "attngeom activation store",
        "=========================",
        "Per-head attention geometry of a transformer (attention weights, projected-value",
        "norms, output norms, cosines) from which contribution weights",
        "c_ij^h = alpha_ij^h * ||v~_j^h|| * cos(o_i^h, v~_j^h) / ||o_i^h|| follow exactly",
        "(Cunningham and Muca Cirone, 'Contribution Weights: A Geometrical Analysis of",
        "Self-Attention Transformers'). v~_j^h = v_j^h W_O^h is the value of token j projected",
        "by head h's block of the output projection; o_i^h = sum_j alpha_ij^h v~_j^h.",
        "o_i = sum_h o_i^h is the output of W_O without its bias, before any normalisation the",
        "model applies to it (Gemma 2/3 and OLMo 2 rescale o_i by an RMSNorm with elementwise",
        "weights before the residual add): c and C are shares of that o_i, not of what the",
        "residual stream finally receives.",
        "Plain netCDF4/HDF5 files: open them with xarray alone (below); attngeom not needed.",
        "",
        "Files",
        "  manifest.json          provenance and shard list with sha256 checksums (JSON)",
        "  shards/shard-NNNNN.nc  netCDF4/HDF5 (h5netcdf), one block of sequences each,",
        ("                         float32 (alpha, cosines: packed int16) with gzip; every"
         if precision_of(cfg["options"]) == PACKED else
         "                         float32 with gzip; every file carries the config as attrs"),
        *(["                         file carries the config as attrs"]
          if precision_of(cfg["options"]) == PACKED else []),
        "  README.txt             this file",
        "",
        "Provenance",
        *("  " + line for line in _provenance_lines(manifest)),
        "",
        *_layout_lines(cfg),
        "",
        "Variables stored: name (dims) [units]",
        *_variable_lines(cfg),
        "",
        "Variables derived on read (attngeom adds them; see the code below):",
        *derived_lines,
        "",
        "Opening with plain xarray",
        _OPEN.replace("STORE", "path/to/store").rstrip(),
        *(["    # packed: middle_count is on (sequence, layer, query); per head:",
           "    #   ds['middle_count'] = ds.middle_count.broadcast_like(ds.head)"]
          if precision_of(cfg["options"]) == PACKED and mode == "compact" else []),
        (_DERIVE_COMPACT if mode == "compact" else _DERIVE_DENSE).rstrip(),
        "",
        "With attngeom installed: attngeom.store.open('path/to/store') does all of this;",
        "`attngeom store validate path/to/store` checks the checksums.",
    ]
    faith = readme_lines(store, manifest)
    return "\n".join(out + ([""] + faith if faith else [])) + "\n"


def _faith_only_text(manifest: dict, store) -> str:
    """README.txt of a store holding faithfulness results only (no extraction shards)."""
    m, v = manifest["config"].get("model", {}), manifest.get("versions", {})
    out = [
        "attngeom store: faithfulness results",
        "====================================",
        "How faithful are attention-based token scores? For each metric (raw attention,",
        "value-weighted attention, its output-normalized form, contribution weights",
        "c_ij^h = alpha_ij^h * ||v~_j^h|| * cos(o_i^h, v~_j^h) / ||o_i^h||), keys are ranked and",
        "removed, and the loss of the language model is measured. Plain netCDF4/HDF5 files.",
        "",
        "Files",
        "  manifest.json   provenance, each result file with its sha256 checksum (JSON)",
        "  <name>.nc       one faithfulness experiment each (below)",
        "  README.txt      this file",
        "",
        "Provenance",
        f"  content hash   {manifest['config_hash']}",
        f"  model          {m.get('id')} ({m.get('architecture')}, {m.get('dtype')}), "
        f"{m.get('n_layers')} layers x {m.get('n_heads')} heads",
        f"  weights        sha256 fingerprint {m.get('weight_fingerprint')}",
        f"  created        {manifest.get('created')} with "
        + ", ".join(f"{k} {v[k]}" for k in sorted(v)),
        "",
        *readme_lines(store, manifest),
    ]
    return "\n".join(out) + "\n"


def write_readme(store: str | Path, manifest: dict) -> Path:
    """Write (atomically) the store's README.txt; return its path."""
    path = Path(store) / README
    atomic_write_bytes(path, readme_text(manifest, store).encode("utf-8"))
    return path
