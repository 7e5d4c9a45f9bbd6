"""Generate a synthetic compact store with the real schema, for analysis benchmarks.

Shards are written with attngeom's own writer (``store.shards.build_shard`` /
``write_shard``) and manifest (``store.manifest.new_manifest`` / ``write_manifest``), so the
files are what ``attngeom extract --mode compact`` writes: same variables, dims, chunking and
compression. Values are random but shaped like real ones (alpha in [0, 1] with a sink that
takes a large share, positive norms, cosines in [-1, 1], middle totals consistent with the
sums), and sequence lengths vary, so NaN padding is present.

    python benchmarks/synthetic_store.py OUT --sequences 2000 --layers 30 --heads 9 --length 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402


def _config(layers: int, heads: int, length: int, sink_k: int, tail_w: int, shard_size: int,
            sequences: int) -> dict:
    model = {"spec": "synthetic", "id": "synthetic", "revision": None,
             "weight_fingerprint": "synthetic", "model_type": "llama",
             "architecture": "LlamaForCausalLM", "causal": True, "dtype": "float32",
             "n_layers": layers, "n_heads": heads, "n_kv_heads": heads, "output_bias": False,
             "tokenizer": None, "bos_token": None}
    data = {"spec": "synthetic", "text_field": None, "sha256": "0" * 64,
            "n_texts": sequences, "limit": None}
    options = {"mode": "compact", "sink_k": sink_k, "tail_w": tail_w, "max_length": length,
               "shard_size": shard_size, "store_text": False}
    return {"model": model, "data": data, "options": options}


def shard_arrays(rng: np.random.Generator, S: int, L: int, H: int, T: int, k: int, w: int,
                 lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Compact-layout float32 arrays (S, L, H, ...) with NaN beyond each length."""
    f32 = np.float32
    shape = (S, L, H, T)
    sink_alpha = rng.beta(2.0, 2.0, size=shape + (k,)).astype(f32) / k
    tail_alpha = (rng.random(shape + (w,), dtype=f32) * (1 - sink_alpha.sum(-1, keepdims=True))
                  / (2 * w))
    value_norm = rng.lognormal(0.0, 0.5, size=shape).astype(f32)
    value_norm[..., 0] *= 0.2                                      # small sink value
    out = {
        "alpha": sink_alpha,
        "cosine": rng.uniform(-1, 1, shape + (k,)).astype(f32),
        "cosine_layer": rng.uniform(-1, 1, shape + (k,)).astype(f32),
        "value_norm": value_norm,
        "sink_value_cosine": rng.uniform(-1, 0.5, shape).astype(f32),
        "output_norm": rng.lognormal(-0.5, 0.5, size=shape).astype(f32),
        "residual_norm": rng.lognormal(-0.7, 0.5, size=shape).astype(f32),
        "sink_residual_cosine": rng.uniform(-1, 0.5, shape).astype(f32),
        "head_share": rng.normal(1.0 / H, 0.05, shape).astype(f32),
        "layer_output_norm": rng.lognormal(0.0, 0.3, size=(S, L, T)).astype(f32),
        "tail_alpha": tail_alpha,
        "tail_cosine": rng.uniform(-1, 1, shape + (w,)).astype(f32),
        "tail_cosine_layer": rng.uniform(-1, 1, shape + (w,)).astype(f32),
    }
    out["middle_alpha"] = 1 - sink_alpha.sum(-1) - tail_alpha.sum(-1)
    out["middle_contribution"] = rng.normal(0.3, 0.2, shape).astype(f32)
    out["middle_contribution_layer"] = out["head_share"] * rng.normal(0.3, 0.2, shape).astype(f32)
    q = np.arange(T)
    out["middle_count"] = np.broadcast_to(np.clip(q + 1 - k - w, 0, None).astype(f32),
                                          shape).copy()
    # structure: NaN beyond length; tail keys below the sink or before 0 are NaN
    lag = np.arange(w)
    tail_bad = (q[:, None] - lag[None, :]) < k                     # (T, w)
    sink_bad = q[:, None] < np.arange(k)[None, :]                  # (T, k)
    for name in ("tail_alpha", "tail_cosine", "tail_cosine_layer"):
        out[name][..., tail_bad] = np.nan
    for name in ("alpha", "cosine", "cosine_layer"):
        out[name][..., sink_bad] = np.nan
    first = out["residual_norm"][..., :k]
    first[...] = 0.0
    out["sink_residual_cosine"][..., :k] = np.nan
    for i, n in enumerate(lengths):
        for name, x in out.items():
            if name == "layer_output_norm":
                x[i, :, n:] = np.nan
            else:
                x[i, :, :, n:] = np.nan
    return out


def generate(out: Path, sequences: int, layers: int, heads: int, length: int,
             sink_k: int = 1, tail_w: int = 8, shard_size: int = 100, seed: int = 0,
             vocab: int = 49152) -> dict:
    """Write the store; return figures (bytes, seconds)."""
    from attngeom.store.format.manifest import file_sha256, new_manifest, write_manifest
    from attngeom.store.format.shards import build_shard, shard_attrs, shard_name, write_shard

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    config = _config(layers, heads, length, sink_k, tail_w, shard_size, sequences)
    manifest = new_manifest(config, sequences, {"versions": {}, "counts": {"skipped_empty": 0}})
    write_manifest(out, manifest)
    attrs = shard_attrs(manifest)
    t_gen = t_write = 0.0
    for index, start in enumerate(range(0, sequences, shard_size)):
        stop = min(sequences, start + shard_size)
        S = stop - start
        t0 = time.perf_counter()
        lengths = rng.integers(length // 2, length + 1, size=S)
        lengths[0] = length
        arrays = shard_arrays(rng, S, layers, heads, length, sink_k, tail_w, lengths)
        token_ids = rng.integers(0, vocab, size=(S, length)).astype(np.int32)
        for i, n in enumerate(lengths):
            token_ids[i, n:] = -1
        extra = {"truncated": (lengths == length).astype(np.int32),
                 "finite": np.ones(S, np.int32), "text_index": np.arange(start, stop)}
        ds = build_shard(arrays, np.arange(start, stop), token_ids, lengths, extra, None,
                         length, "compact", attrs)
        special = np.zeros((S, length), np.int8)
        special[:, 0] = 1
        ds["special"] = (("sequence", "position"), special)
        t1 = time.perf_counter()
        name = shard_name(index)
        write_shard(ds, out / name)
        t2 = time.perf_counter()
        t_gen, t_write = t_gen + t1 - t0, t_write + t2 - t1
        manifest["shards"].append({"file": name, "sequences": [start, stop],
                                   "sha256": file_sha256(out / name),
                                   "truncated": int(extra["truncated"].sum()), "nonfinite": 0})
        write_manifest(out, manifest)
    manifest["counts"].update(truncated=sum(e["truncated"] for e in manifest["shards"]),
                              nonfinite=0)
    manifest["complete"] = True
    write_manifest(out, manifest)
    nbytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"store": str(out), "sequences": sequences, "layers": layers, "heads": heads,
            "length": length, "bytes": nbytes, "generate_s": t_gen, "write_s": t_write}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--sequences", type=int, default=200)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--sink-k", type=int, default=1)
    p.add_argument("--tail-w", type=int, default=8)
    p.add_argument("--shard-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    emit({"case": "synthetic_store", **generate(Path(a.out), a.sequences, a.layers, a.heads,
                                                a.length, a.sink_k, a.tail_w, a.shard_size,
                                                a.seed)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
