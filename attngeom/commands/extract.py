"""``attngeom extract``: measure a model over texts into a store.

Arguments, the model spec, the texts and the output folder are checked before torch is
imported, so a bad command line fails in a fraction of a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from attngeom.common.options.commands import ExtractCommand
from attngeom.common.options.stages import ExtractConfig, add_arguments, from_args
from attngeom.common.errors import Refusal


def add_parser(p) -> None:
    add_arguments(p, ExtractCommand)
    add_arguments(p, ExtractConfig)


def check_out(out: str) -> None:
    """ValueError when ``out`` cannot become a writable folder (checked without writing)."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise Refusal(f"--out {path} is a file; give a folder (created if absent)")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise Refusal(f"--out {path}: {parent} is not writable; choose a writable folder")


def check_model(model: str, dtype: str, device: str) -> None:
    """Model spec, dtype and device, without importing torch."""
    from attngeom.extract.loading.models import check_dtype, check_spec

    check_dtype(dtype, device)
    check_spec(model)


def use_threads(n: int | None) -> None:
    """``--threads``: set torch's and BLAS's thread count (None: leave torch's default)."""
    if n is not None:
        from attngeom.pipeline import limit_threads

        limit_threads(n)


def load_data(data: str, cfg: ExtractConfig):
    """The texts, or for a folder / ``--image-field`` the images, named by ``--data``."""
    from attngeom.extract.loading.data import load_texts
    from attngeom.extract.loading.images import is_image_spec, load_images
    from attngeom.extract.loading.probes import is_probe, parse_probe

    if is_probe(data):                   # drawn from the tokenizer once the model is loaded
        parse_probe(data)
        return None
    if is_image_spec(data, cfg.image_field):
        return load_images(data, cfg.image_field, cfg.limit)
    texts = load_texts(data, text_field=cfg.text_field,
                       limit=None if cfg.min_length else cfg.limit)
    if not texts.texts:
        raise Refusal(f"--data {data} holds no non-empty text "
                         f"({texts.skipped_empty} empty skipped); give a file with texts")
    return texts


def run(args) -> int:
    from attngeom.store.format.parts import parse_part

    cmd, cfg = from_args(args, ExtractCommand), from_args(args, ExtractConfig)
    cfg.check()
    part = parse_part(cmd.part) if cmd.part is not None else None       # (I, N), parsed once
    check_model(cmd.model, cfg.dtype, cfg.device)
    check_out(cmd.out)
    use_threads(cmd.threads)
    texts = load_data(cmd.data, cfg)

    from attngeom.extract.run import extract
    from attngeom.store.ops.info import summary

    extract(cmd.model, cmd.data, cmd.out, cfg, trust_remote_code=cmd.trust_remote_code,
            progress=not cmd.quiet, part=part, texts=texts,
            beyond_context=cmd.beyond_context)
    print(summary(cmd.out))
    return 0
