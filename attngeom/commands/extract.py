"""``attngeom extract``: measure a model over texts into a store.

Arguments, the model spec, the texts and the output folder are checked before torch is
imported, so a bad command line fails in a fraction of a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from attngeom.store.vocab import FLOAT32, PRECISIONS


def add_parser(p) -> None:
    p.add_argument("--model", required=True,
                   help="hub id, model directory, .gguf file, or smollm2-135m/gemma3-270m/minilm-l6")
    p.add_argument("--data", required=True,
                   help="a .jsonl/.parquet/.txt file, hf:NAME[:CONFIG]:SPLIT, or builtin")
    p.add_argument("--out", required=True, help="store directory (created, or resumed)")
    p.add_argument("--mode", choices=["compact", "dense"], default="compact")
    p.add_argument("--max-length", type=int, default=512, help="tokens per text (truncated)")
    p.add_argument("--limit", type=int, default=None, help="use the first N texts")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (GPU)")
    p.add_argument("--text-field", default=None, help="field of JSONL/Parquet records")
    p.add_argument("--sink-k", type=int, default=1, help="sink keys: the first k positions")
    p.add_argument("--tail-w", type=int, default=8, help="tail window: w most recent keys")
    p.add_argument("--shard-size", type=int, default=None, help="sequences per shard file")
    p.add_argument("--no-text", action="store_true", help="leave token strings out")
    p.add_argument("--precision", choices=PRECISIONS, default=FLOAT32,
                   help="float32, or packed (~0.54x the bytes): alpha and cosines as "
                        "CF-packed int16 (errors <= 7.7e-6 / 3.06e-5), norms with 14 mantissa "
                        "bits (relative error <= 3.1e-5), middle_count once per layer")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="extract only part I (0-based) of N, a contiguous block of shard files; "
                        "join the N part stores with `attngeom store merge`")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code from the hub (off by default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def check_at_least_one(args, names: tuple[str, ...]) -> None:
    """ValueError naming the first option (``--max-length`` ...) below 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be at least 1, not {value}")


def check_out(out: str) -> None:
    """ValueError when ``out`` cannot become a writable folder (checked without writing)."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file; give a folder (created if absent)")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {parent} is not writable; choose a writable folder")


def check_model(args) -> None:
    """Model spec, dtype and device, without importing torch."""
    from attngeom.extract.models import check_dtype, check_spec

    check_dtype(args.dtype, args.device)
    check_spec(args.model)


def run(args) -> int:
    from attngeom.extract.data import load_texts

    check_at_least_one(args, ("sink_k", "tail_w", "max_length", "batch_size", "limit",
                              "shard_size"))
    if args.shard is not None:
        from attngeom.store.distributed import parse_shard

        parse_shard(args.shard)
    check_model(args)
    check_out(args.out)
    texts = load_texts(args.data, text_field=args.text_field, limit=args.limit)
    if not texts.texts:
        raise ValueError(f"--data {args.data} holds no non-empty text "
                         f"({texts.skipped_empty} empty skipped); give a file with texts")

    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.store.info import summary

    cfg = ExtractConfig(mode=args.mode, sink_k=args.sink_k, tail_w=args.tail_w,
                        max_length=args.max_length, limit=args.limit, text_field=args.text_field,
                        shard_size=args.shard_size, store_text=not args.no_text,
                        batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                        precision=args.precision)
    extract(args.model, args.data, args.out, cfg, trust_remote_code=args.trust_remote_code,
            progress=not args.quiet, shard=args.shard, texts=texts)
    print(summary(args.out))
    return 0
