"""A readable summary of a store, from its manifest and shard sizes (no data loaded)."""

from __future__ import annotations

from pathlib import Path

from ..format.manifest import coverage_problems, read_manifest
from ..io.results import describe, entries, is_faith_only


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def summary(path: str | Path) -> str:
    """Multi-line text describing the store at ``path``."""
    path = Path(path)
    m = read_manifest(path)
    if is_faith_only(m):
        return _faith_only_summary(path, m)
    model, data, opts = m["config"]["model"], m["config"]["data"], m["config"]["options"]
    done = sum(e["sequences"][1] - e["sequences"][0] for e in m["shards"])
    nbytes = sum((path / e["file"]).stat().st_size for e in m["shards"]
                 if (path / e["file"]).is_file())
    counts = m.get("counts", {})
    problems = coverage_problems(m, partial=not m["complete"])
    layout = ("dense (query x key)" if opts["mode"] == "dense" else
              f"compact (sink k={opts['sink_k']}, tail w={opts['tail_w']}, middle totals)")
    lines = [
        f"store        {path}",
        f"status       {'complete' if m['complete'] else 'INCOMPLETE'}: {done} of "
        f"{m['n_sequences']} sequences in {len(m['shards'])} shard(s), {_size(nbytes)}"
        + (f"; DAMAGED: {problems[0]} (run `attngeom store validate`)" if problems else ""),
        f"content hash {m['config_hash'][:16]}",
        f"model        {model['id']} ({model['architecture']}, {model['model_type']}, "
        f"{model['dtype']}), {model['n_layers']} layers x {model['n_heads']} heads "
        f"({model['n_kv_heads']} kv), {'causal' if model['causal'] else 'bidirectional'}"
        + _model_extras(model),
        f"weights      fingerprint {model['weight_fingerprint'][:16]}"
        + (f", revision {str(model['revision'])[:16]}" if model.get("revision") else ""),
        f"data         {data['spec']} ({data['n_texts']} "
        f"{'images' if model.get('inputs') == 'image' else 'texts'}, sha256 {data['sha256'][:16]})",
        f"layout       {layout}, max_length {opts['max_length']}",
        f"counts       {counts.get('truncated', 0)} truncated, {counts.get('skipped_empty', 0)} "
        f"empty skipped, {counts.get('nonfinite', 0)} non-finite",
        f"created      {m['created']} with attngeom {m.get('versions', {}).get('attngeom', '?')}",
        "open with    xarray.open_mfdataset('"
        f"{path}/shards/*.nc', engine='h5netcdf', combine='nested', concat_dim='sequence')",
    ]
    return "\n".join(lines[:-1] + _origin_lines(m) + _result_lines(m) + lines[-1:]
                      + (["readme       README.txt (variables, layout, provenance)"]
                         if (path / "README.txt").is_file() else []))


def _model_extras(model: dict) -> str:
    """What a store of this model holds beyond the usual: learned sinks, a vision tower."""
    extras = []
    if model.get("learned_sinks"):
        extras.append("learned sinks (learned_sink_alpha stored)")
    if model.get("inputs") == "image":
        extras.append("vision: tokens are image patches")
    if model.get("tower"):
        extras.append(f"{model['tower']} tower of the checkpoint")
    return "".join(f", {e}" for e in extras)


def _result_lines(m: dict) -> list[str]:
    """One line per faithfulness result the store holds."""
    return [f"faithfulness {describe(e)}" for e in entries(m).values()]


def _faith_only_summary(path: Path, m: dict) -> str:
    """A store with faithfulness results only (``attngeom faithfulness --out NEW``)."""
    model = m["config"].get("model", {})
    lines = [
        f"store        {path}",
        f"status       faithfulness results only (no extracted sequences); "
        f"{len(entries(m))} result file(s)",
        f"content hash {m['config_hash'][:16]}",
        f"model        {model.get('id')} ({model.get('architecture')}, "
        f"{model.get('model_type')}, {model.get('dtype')}), {model.get('n_layers')} layers x "
        f"{model.get('n_heads')} heads ({model.get('n_kv_heads')} kv)",
        f"weights      fingerprint {str(model.get('weight_fingerprint'))[:16]}",
        f"created      {m['created']} with attngeom {m.get('versions', {}).get('attngeom', '?')}",
        *_result_lines(m),
        f"open with    xarray.open_dataset('{path}/<file>.nc', engine='h5netcdf')",
    ]
    return "\n".join(lines + (["readme       README.txt (variables, provenance)"]
                              if (path / "README.txt").is_file() else []))


def _origin_lines(m: dict) -> list[str]:
    """Where the store came from: a part of a sharded run, a merge, a subset."""
    lines = []
    if m.get("part"):
        p = m["part"]
        lines.append(f"part         {p['index']}/{p['count']} of a sharded extraction: sequences "
                     f"[{p['sequences'][0]}, {p['sequences'][1]}) of {m['n_sequences']}; "
                     "join all parts with `attngeom store merge`")
    parts = m["config"]["data"].get("parts")
    if parts:
        dropped = sum(len(q.get("dropped", [])) for q in parts)
        lines.append(f"merged       {len(parts)} data sets, {dropped} duplicate sequence(s) "
                     "dropped")
    elif m.get("merge"):
        lines.append(f"merged       from {len(m['merge'].get('inputs', []))} store(s)")
    cut = m["config"].get("subset")
    if cut:
        lines.append(f"subset       of {str(cut.get('source_config_hash'))[:16]}: layers "
                     f"{cut['layers']}, heads {cut['heads']}, {cut['n_sequences']} sequences"
                     + (f", without {len(cut['dropped_variables'])} variable(s)"
                        if cut.get("dropped_variables") else "")
                     + (", faithfulness results kept whole"
                        if cut.get("faithfulness_kept_whole") else ""))
    return lines
