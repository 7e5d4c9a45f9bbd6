"""Images in, vision-transformer token batches out.

An *image spec* names where images come from:

- a folder: every ``.png``, ``.jpg`` and ``.jpeg`` file in it (not in subfolders), sorted by
  name;
- ``hf:NAME[:CONFIG]:SPLIT`` with ``--image-field`` (default: ``image`` if the first record has
  it, else its first image field): ``datasets.load_dataset(NAME, CONFIG, split=SPLIT)``.

Images are converted to RGB and preprocessed by the model's own image processor. Each image is
one sequence; its tokens are named ``[CLS]`` (and ``[DIST]`` for DeiT, ``reg0``, ``reg1``, ...
for DINOv2 registers) followed by the patches ``p(row,col)`` in row-major order. SigLIP has no
CLS token: its first token, the one the sink analyses treat as the sink, is the top-left patch
``p(0,0)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .data import Sequences, iter_records
from attngeom.common.errors import Refusal

if TYPE_CHECKING:                                   # torch is imported when a model runs
    from ..measurement.layer import Options

SUFFIXES = (".png", ".jpg", ".jpeg")
IMAGE_HELP = "give a folder of .png/.jpg images or hf:NAME[:CONFIG]:SPLIT with --image-field"


@dataclass(frozen=True)
class ImageSet:
    """Selected images and their provenance.

    ``texts`` holds the images themselves (file paths or decoded images): the extraction run
    treats a list of images like a list of texts. ``names`` are file names or ``row N``.
    """

    texts: list
    names: list[str]
    spec: str
    sha256: str
    skipped_empty: int = 0

    kind = "image"               # what a model of this data takes (its ``inputs``)

    def __len__(self) -> int:
        return len(self.texts)


def is_image_spec(spec: str, image_field: str | None = None) -> bool:
    """True for a folder, or an ``hf:`` spec read with ``--image-field``."""
    return Path(str(spec)).expanduser().is_dir() or (
        str(spec).startswith("hf:") and image_field is not None)


def _is_image(value: Any) -> bool:
    return hasattr(value, "convert") and hasattr(value, "size")


def load_images(spec: str, image_field: str | None = None, limit: int | None = None) -> ImageSet:
    """Images of a folder or an ``hf:`` dataset (see the module docstring).

    ValueError (one line, with the fix) for an empty folder, a missing field or a file that is
    not an image.
    """
    spec = str(spec)
    if limit is not None and limit < 1:
        raise Refusal(f"--limit must be at least 1, not {limit}")
    h = hashlib.sha256()
    if Path(spec).expanduser().is_dir():
        folder = Path(spec).expanduser()
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and p.suffix.lower() in SUFFIXES)[:limit]
        if not files:
            raise Refusal(f"--data {folder} holds no .png/.jpg/.jpeg image; {IMAGE_HELP}")
        for path in files:
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        return ImageSet([str(p) for p in files], [p.name for p in files], spec, h.hexdigest())
    if not spec.startswith("hf:"):
        raise Refusal(f"--data {spec} is not a folder of images; {IMAGE_HELP}")
    images, names, field = [], [], image_field
    for where, rec in iter_records(spec):
        if limit is not None and len(images) >= limit:
            break
        if field is None or field == "image" and field not in rec:
            field = "image" if _is_image(rec.get("image")) else next(
                (k for k, v in rec.items() if _is_image(v)), None)
        if field is None or field not in rec or not _is_image(rec[field]):
            raise Refusal(f"{spec} {where}: no image field {field or ''} (fields: "
                             f"{', '.join(rec)}); pass --image-field naming the image column")
        image = rec[field].convert("RGB")
        h.update(where.encode() + b"\0" + image.tobytes())
        images.append(image)
        names.append(where)
    if not images:
        raise Refusal(f"--data {spec} holds no image; {IMAGE_HELP}")
    return ImageSet(images, names, spec, h.hexdigest())


def open_image(item):
    """An RGB PIL image from a path or an already decoded image."""
    from PIL import Image, UnidentifiedImageError

    if _is_image(item):
        return item.convert("RGB")
    try:
        with Image.open(item) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise Refusal(f"{item} is not a readable image ({exc}); remove it from the folder") \
            from None


def pixel_batch(processor, items: list) -> "Any":
    """``pixel_values`` (B, C, H, W) of ``items`` preprocessed by the model's processor;
    ``items`` that are not a list are pixel values already (a tensor, in memory)."""
    if not isinstance(items, list):
        return items
    images = [open_image(x) for x in items]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def image_id(pixels: np.ndarray) -> int:
    """A 31-bit id of an image's preprocessed pixels (stored as its token_id: merges of
    stores recognise repeated images by their token ids)."""
    digest = hashlib.sha256(np.ascontiguousarray(pixels, dtype=np.float32).tobytes()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _prefix_names(model) -> list[str]:
    """Names of the tokens a vision model puts before its patches, from its embeddings."""
    names = []
    for module in model.modules():
        if getattr(module, "cls_token", None) is not None or \
                getattr(module, "class_embedding", None) is not None:
            names.append("[CLS]")
            if getattr(module, "distillation_token", None) is not None:
                names.append("[DIST]")
            registers = getattr(module, "register_tokens", None)
            if registers is not None:
                names += [f"reg{i}" for i in range(registers.shape[-2])]
            break
    return names


def token_names(model, n_tokens: int, height: int, width: int) -> list[str]:
    """``[CLS]``, ``[DIST]``, ``reg0``... then ``p(row,col)`` for an image of this size.

    ValueError when the model makes fewer tokens than patches (it drops patches, as MAE
    pre-training does), which a store of fixed positions cannot describe.
    """
    cfg = getattr(model.config, "vision_config", None) or model.config
    patch = getattr(cfg, "patch_size", 16)
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)[:2]
    rows, cols = height // ph, width // pw
    prefix = n_tokens - rows * cols
    if prefix < 0:
        raise Refusal(f"the model makes {n_tokens} tokens from {rows} x {cols} patches: it "
                         "drops patches (e.g. MAE masking); not supported")
    names = _prefix_names(model)
    names = names if len(names) == prefix else [f"t{i}" for i in range(prefix)]
    return names + [f"p({r},{c})" for r in range(rows) for c in range(cols)]


class _Stop(Exception):
    """Ends a forward pass once the first attention layer has shown its input."""


def image_tokens(loaded, items: list) -> int:
    """Tokens the model makes from an image preprocessed like ``items[0]``: the store's
    ``max_length`` for images (the input of the first attention layer, read by a hook)."""
    import torch

    from ..measurement.archs import discover

    model = loaded.model
    param = next(model.parameters())
    pixels = pixel_batch(loaded.tokenizer, items[:1]).to(param.device, param.dtype)
    seen: list[int] = []

    def pre(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        seen.append(int(x.shape[1]))
        raise _Stop

    handle = discover(model).layers[0].module.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(pixel_values=pixels)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen[0]


def measure_images(loaded, items: list, batch_size: int, opts: "Options",
                   store_text: bool, bar=None, layers=None) -> Iterator[tuple[dict, Sequences]]:
    """Measure ``items`` in order, ``batch_size`` images per forward pass.

    Yields each batch's arrays (as :func:`attngeom.extract.measurement.capture.capture` returns
    them; ``{}`` with ``layers``, a :class:`~attngeom.extract.measurement.batches.LayerRows`
    that gets each layer as it is measured) and its :class:`Sequences`.
    """
    from ..measurement.capture import capture

    model, param = loaded.model, next(loaded.model.parameters())
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        pixels = pixel_batch(loaded.tokenizer, chunk)
        arrays = capture(model, {"pixel_values": pixels.to(param.device, param.dtype)}, opts,
                         each_layer=None if layers is None else layers.add)
        if layers is not None:
            layers.commit(len(chunk))
        T = arrays["value_norm"].shape[-1] if layers is None else layers.width
        names = token_names(model, T, pixels.shape[-2], pixels.shape[-1])
        ids = np.array([image_id(p) for p in pixels.float().numpy()], dtype=np.int64)
        special = np.array([not n.startswith("p(") for n in names], dtype=np.int8)
        yield arrays, Sequences(
            token_ids=np.repeat(ids[:, None], T, axis=1), lengths=np.full(len(chunk), T),
            special=np.tile(special, (len(chunk), 1)),
            tokens=[list(names) for _ in chunk] if store_text else None,
            truncated=np.zeros(len(chunk), dtype=np.int32))
        if bar is not None:
            bar.update(len(chunk))
