"""A readable summary of a store, from its manifest and shard sizes (no data loaded)."""

from __future__ import annotations

from pathlib import Path

from .manifest import read_manifest


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
    cfg, model, data, opts = m["config"], m["config"]["model"], m["config"]["data"], \
        m["config"]["options"]
    done = sum(e["sequences"][1] - e["sequences"][0] for e in m["shards"])
    nbytes = sum((path / e["file"]).stat().st_size for e in m["shards"]
                 if (path / e["file"]).is_file())
    counts = m.get("counts", {})
    layout = (f"dense (query x key)" if opts["mode"] == "dense" else
              f"compact (sink k={opts['sink_k']}, tail w={opts['tail_w']}, middle totals)")
    lines = [
        f"store        {path}",
        f"status       {'complete' if m['complete'] else 'INCOMPLETE'}: {done} of "
        f"{m['n_sequences']} sequences in {len(m['shards'])} shard(s), {_size(nbytes)}",
        f"content hash {m['config_hash'][:16]}",
        f"model        {model['id']} ({model['architecture']}, {model['model_type']}, "
        f"{model['dtype']}), {model['n_layers']} layers x {model['n_heads']} heads "
        f"({model['n_kv_heads']} kv), {'causal' if model['causal'] else 'bidirectional'}",
        f"weights      fingerprint {model['weight_fingerprint'][:16]}"
        + (f", revision {str(model['revision'])[:16]}" if model.get("revision") else ""),
        f"data         {data['spec']} ({data['n_texts']} texts, sha256 {data['sha256'][:16]})",
        f"layout       {layout}, max_length {opts['max_length']}",
        f"counts       {counts.get('truncated', 0)} truncated, {counts.get('skipped_empty', 0)} "
        f"empty skipped, {counts.get('nonfinite', 0)} non-finite",
        f"created      {m['created']} with attngeom {m.get('versions', {}).get('attngeom', '?')}",
        "open with    xarray.open_mfdataset('"
        f"{path}/shards/*.nc', engine='h5netcdf', combine='nested', concat_dim='sequence')",
    ]
    return "\n".join(lines)
