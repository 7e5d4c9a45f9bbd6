"""Store bytes per token and shard write throughput; one JSON object per line.

Real measurements (``smollm2-135m`` over the builtin texts, else a random-init SmolLM2-shaped
model) are assembled into a shard exactly as ``attngeom extract`` does (``extract_shard``), then
written with attngeom's writer (gzip level 1 + shuffle + Fletcher-32, fsync), as HDF5 compresses
it (``attngeom``) and from chunks compressed by ``store.chunks.ChunkEncoder`` in 1 or 2 threads
after measuring (``encoded_1thread``, ``encoded_2threads``: the measured variables' chunks of
one batch of sequences, as ``attngeom extract`` writes them; the encoding is timed, the
measuring is not), and, for comparison, with other HDF5 filters (gzip 4, lzf, none),
interleaved and repeated. Reports bytes per real token,
uncompressed MB/s and the ratio of each variant's time to attngeom's.

Section ``precision``: bytes per token and per head and token of compact stores written with
``--precision float32`` and ``packed`` from the same texts (WikiText-2 articles cut to
``--max-length``), side by side: SmolLM2-135M (real weights; a random-init SmolLM2-shaped
model too) and a 2-layer random-init model of Llama-3.1-8B's widths (hidden 4096, 32 heads, 8
kv heads, head_dim 128, MLP 14336; SmolLM2's tokenizer, so vocab 49152), whose layer-dependent
bytes are scaled to 32 layers. Each store is measured and written as ``attngeom extract`` does
(``extract_shard`` + ``StoreWriter``); bytes are the shard files' (exact, per variable from
HDF5's storage sizes). Also the largest quantisation error of each packed variable and of the
derived contributions against the float32 store.

    python benchmarks/bench_store.py --sections writes --modes compact,dense
    python benchmarks/bench_store.py --sections precision
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import WIKITEXT, emit, log, machine  # noqa: E402

# mode -> (texts, max_length): dense stores are T x T per head, so they get fewer, shorter texts
SIZES = {"compact": (8, 512), "dense": (2, 128)}


def build(mode: str, model_spec: str):
    """The shard Dataset ``attngeom extract`` would write, and its real token count."""
    from tqdm.auto import tqdm

    from attngeom.extract.loading.data import load_texts
    from attngeom.extract.measurement.layer import Options
    from attngeom.extract.loading.models import load
    from attngeom.extract.run import ExtractConfig, extract_shard, store_config
    from attngeom.store.format.manifest import new_manifest
    from attngeom.store.format.shards import read_shard, shard_attrs, write_shard

    n, T = SIZES[mode]
    cfg = ExtractConfig(mode=mode, max_length=T, limit=n)
    texts = load_texts("builtin", limit=n)
    loaded = load(model_spec)
    manifest = new_manifest(store_config(loaded.info, texts, cfg, n), n, {})
    ds, encoded = extract_shard(loaded, texts.texts, 0, cfg, Options(mode), tqdm(disable=True))
    ds.attrs = shard_attrs(manifest)
    with tempfile.TemporaryDirectory() as tmp:       # the whole shard, measured arrays too
        write_shard(ds, Path(tmp) / "shard.nc", encoded)
        ds = read_shard(Path(tmp) / "shard.nc")
    return ds, int(ds["length"].sum()), loaded.info["spec"]


def variants(ds) -> dict:
    """name -> callable(path) writing ``ds``; ``attngeom`` is the real writer."""
    from attngeom.store.format.shards import encoding, write_shard

    def with_filter(**filt):
        def write(path):
            enc = encoding(ds)
            for e in enc.values():
                e.pop("zlib", None), e.pop("complevel", None)
                if not filt:
                    e.pop("shuffle", None)
                e.update(filt)
            ds.to_netcdf(path, engine="h5netcdf", encoding=enc, invalid_netcdf=False)
        return write

    from attngeom.store.format import schema as S
    from attngeom.store.format.chunks import ChunkEncoder

    measured = [n for n in S.variables_for(ds.attrs["mode"]) if n in ds and ds[n].dtype == "f4"
                and ds[n].dims[:2] == (S.SEQUENCE, S.LAYER)]

    def encoded(threads):
        def write(path):
            enc = ChunkEncoder(min(4, ds.sizes[S.SEQUENCE]), 0, threads)
            enc.add({n: ds[n].values for n in measured})
            write_shard(ds, path, enc.finish())
        return write

    return {"attngeom": lambda path: write_shard(ds, path),
            "encoded_1thread": encoded(1), "encoded_2threads": encoded(2),
            "gzip4": with_filter(zlib=True, complevel=4, shuffle=True),
            "lzf": with_filter(compression="lzf", shuffle=True),
            "none": with_filter()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default="writes,precision")
    p.add_argument("--modes", default="compact,dense")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=str(WIKITEXT),
                   help="texts of the precision section (WikiText-2)")
    p.add_argument("--texts", type=int, default=8, help="precision: texts of the SmolLM2 cases")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--llama-texts", type=int, default=4, help="precision: texts of the 8B case")
    a = p.parse_args(argv)
    emit({"bench": "store", "section": "machine", **machine()})
    sections = a.sections.split(",")
    if "precision" in sections:
        from bench_precision import precision_section

        precision_section(a)
    if "writes" not in sections:
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-"))
    try:
        for mode in a.modes.split(","):
            try:
                ds, tokens, spec = build(mode, a.model)
            except (ValueError, ImportError) as exc:
                emit({"bench": "store", "mode": mode, "skipped": f"{a.model}: {exc}"})
                continue
            raw = sum(v.nbytes for v in ds.data_vars.values() if v.dtype != object)
            fns = variants(ds)
            times = {k: [] for k in fns}
            sizes = {}
            for r in range(a.repeats):
                names = list(fns)[r % len(fns):] + list(fns)[: r % len(fns)]
                for name in names:
                    path = tmp / f"{mode}-{name}-{r}.nc"
                    t0 = time.perf_counter()
                    fns[name](path)
                    times[name].append(time.perf_counter() - t0)
                    sizes[name] = path.stat().st_size
                    path.unlink()
                log(f"store {mode} round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:.2f}s" for k, v in times.items()))
            base = times["attngeom"]
            for name, t in times.items():
                emit({"bench": "store", "mode": mode, "case": name, "model": spec,
                      "sequences": int(ds.sizes["sequence"]), "max_length": SIZES[mode][1],
                      "tokens": tokens, "bytes": sizes[name],
                      "bytes_per_token": sizes[name] / tokens,
                      "uncompressed_bytes_per_token": raw / tokens,
                      "write_median_s": median(t), "write_min_s": min(t),
                      "write_mb_per_s": raw / 1e6 / median(t),
                      "tokens_per_s": tokens / median(t),
                      "ratio_paired_vs_attngeom": median(x / y for x, y in zip(t, base))})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
