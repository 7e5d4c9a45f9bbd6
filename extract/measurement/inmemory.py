"""Measure a model object in memory: ``attngeom.measure(model, inputs)`` -> ``xarray.Dataset``.

The measurement is the one ``attngeom extract`` makes (the measurement loop,
:func:`attngeom.extract.measurement.batches.measure_rows`: the same tokenization, batches,
padding and NaN conventions), its rows gathered into numpy arrays (:class:`Collector`) instead
of compressed shard chunks. The Dataset has the variables, dims and ``attrs`` of an
opened store (:func:`attngeom.store.io.reader.store_attrs` of the manifest a store of these
inputs gets, so the same config and ``config_hash``), the contributions derived as on read
(:func:`attngeom.store.io.reader.add_derived`); ``attngeom.store.write(ds, path)`` saves it as a
store.

Inputs
------
texts   a str or a list of str, with ``tokenizer=``: tokenized as extract tokenizes (the
        tokenizer's special tokens, BOS where it adds one; cut at ``max_length``).
tokens  a mapping (dict, ``BatchEncoding``) with ``input_ids`` (B, T) and optionally
        ``attention_mask``; each row's real tokens are the ones its mask marks, one unbroken
        run. Left padding is moved to the right: position 0 is each sequence's first real
        token, as the store assumes, so a left-padded batch gives the numbers of the same
        batch right-padded. ``tokenizer=`` (optional) gives token strings and special tokens
        (without one: no strings, and the ids the model's config names bos/eos/pad/... are
        the special tokens).
pixels  a mapping with ``pixel_values`` (B, C, H, W), e.g. the output of the model's image
        processor; tokens are named ``[CLS]``, ``p(row,col)``, ... as extract names them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import xarray as xr

from attngeom.store.format.manifest import new_manifest
from attngeom.common.options.stages import ExtractConfig, check_sink_window
from attngeom.store.io.reader import add_derived, store_attrs

from ..loading.data import Tokenized, texts_sha256, tokenize_texts
from attngeom.common.errors import Refusal

IGNORED_KEYS = ("special_tokens_mask", "offset_mapping", "length", "overflow_to_sample_mapping")
CONFIG_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                  "cls_token_id", "unk_token_id", "mask_token_id")
DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16",
               "torch.float16": "float16"}


class Source(NamedTuple):
    """What the store's ``config.data`` records of in-memory inputs."""

    texts: Sequence               # one entry per sequence
    spec: str
    sha256: str


def measure(model, inputs, mode: str = ExtractConfig.mode, sink_k: int = ExtractConfig.sink_k,
            tail_w: int = ExtractConfig.tail_w, *, tokenizer=None, max_length: int | None = None,
            batch_size: int = ExtractConfig.batch_size, store_text: bool = True,
            shard_size: int | None = None, data: str | None = None,
            progress: bool = False) -> xr.Dataset:
    """Measure ``model`` on ``inputs`` in memory, as an opened store of them would read.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any device and dtype, in eval mode or not: it is measured in eval mode and left as it
        was, also when this raises.
    inputs : list of str or Mapping
        Texts (with ``tokenizer``), a mapping with ``input_ids`` [and ``attention_mask``], or
        a mapping with ``pixel_values``; see the module doc.
    mode : {"compact", "dense"}
        The layout, as ``attngeom extract --mode``.
    sink_k : int
        Sink keys: the first k positions.
    tail_w : int
        Tail window: the w most recent non-sink keys up to each query.
    tokenizer : object, optional
        The tokenizer (texts; optional for token ids) or the image processor (pixels; only its
        class name is recorded).
    max_length : int, optional
        Tokens per text (cut there; the Dataset's positions). Default: texts are cut at
        extract's default and the positions are those of the longest sequence.
    batch_size : int
        Rows per forward pass.
    store_text : bool
        Keep the token strings (``token``).
    shard_size : int, optional
        The sequences per file of a later :func:`attngeom.store.write` (recorded in the config
        as extract records it).
    data : str, optional
        The name recorded as the data spec (default ``in-memory texts`` / ``token ids`` /
        ``pixel_values``); with the file name the texts came from, and the options of an
        ``attngeom extract`` run over that file, the config hash is that store's.
    progress : bool
        Show a progress bar.

    Returns
    -------
    xarray.Dataset
        The names, dims, NaN conventions and attrs of ``attngeom.store.open`` (contributions
        derived), held in memory.
    """
    from .preserve import unchanged

    cfg = ExtractConfig(mode=mode, sink_k=sink_k, tail_w=tail_w, batch_size=batch_size,
                        max_length=ExtractConfig.max_length if max_length is None else max_length,
                        store_text=store_text, shard_size=shard_size)
    cfg.check()
    with unchanged(model):
        return _measure(model, inputs, cfg, tokenizer, max_length, data, progress)


def _measure(model, inputs, cfg: ExtractConfig, tokenizer, max_length, data, progress):
    from dataclasses import replace

    from tqdm.auto import tqdm

    from .archs import discover
    from .layer import Options
    from ..loading.models import Loaded
    from ..run import default_shard_size, shard_dataset, store_config
    from .batches import measure_rows

    arch = discover(model)                  # refuses an unsupported model in one line
    items, source, width = _inputs(model, arch.inputs, inputs, tokenizer, max_length,
                                   cfg.max_length)
    source = source if data is None else source._replace(spec=str(data))
    info = model_info(model, tokenizer)
    loaded = Loaded(model, tokenizer, info)
    if arch.inputs == "image":
        from ..loading.images import image_tokens

        width = image_tokens(loaded, items)
    cfg = replace(cfg, max_length=width, device=str(_parameter(model).device),
                  store_text=cfg.store_text and (tokenizer is not None or arch.inputs == "image"))
    check_sink_window(cfg.sink_k, cfg.max_length)
    _warn_beyond_context(model, cfg.max_length, arch.inputs)
    shard_size = cfg.shard_size or default_shard_size(cfg, info["n_layers"], info["n_heads"])
    opts = Options(cfg.mode, cfg.sink_k, cfg.tail_w, derived=False)   # derived as on read
    bar = tqdm(total=len(items), unit="seq", desc="measure", disable=not progress)
    try:
        ds = shard_dataset(measure_rows(loaded, items, cfg, opts, Collector(len(items)), bar),
                           0, cfg)
    finally:
        bar.close()
    if tokenizer is None and arch.inputs == "text":
        ds["special"] = ds["special"].copy(data=_config_special(model, ds["token_id"].values))
    manifest = _manifest(model, store_config(info, source, cfg, shard_size), ds, source)
    ds.attrs = store_attrs(manifest)
    return add_derived(ds)


def _parameter(model):
    return next(model.parameters())


def model_info(model, tokenizer) -> dict:
    """The store's ``config.model`` of a model object (as
    :func:`attngeom.extract.loading.models.load` records it: the spec is the name or folder it was
    loaded from)."""
    from ..loading.models import model_info as info

    spec = getattr(model.config, "_name_or_path", "") or type(model).__name__
    dtype = str(_parameter(model).dtype)
    return info(spec, model, tokenizer, getattr(model.config, "_commit_hash", None),
                DTYPE_NAMES.get(dtype, dtype.removeprefix("torch.")))


def _manifest(model, config: dict, ds: xr.Dataset, source: Source) -> dict:
    from ..provenance import versions

    try:
        model_config = json.loads(model.config.to_json_string())
    except (TypeError, ValueError, AttributeError):
        model_config = None
    extra = {"versions": versions(),
             "counts": {"skipped_empty": 0, "truncated": int(ds["truncated"].sum()),
                        "nonfinite": int((ds["finite"] == 0).sum())},
             "sources": {"model": getattr(model.config, "_name_or_path", ""),
                         "data": source.spec},
             "in_memory": {"model_class": type(model).__name__, "model_config": model_config,
                           "device": str(_parameter(model).device)}}
    return new_manifest(config, len(source.texts), extra, complete=True)


# ----------------------------------------------------------------------------- inputs
def _inputs(model, kind: str, inputs, tokenizer, max_length: int | None, limit: int):
    """(what measure_rows measures, the data's :class:`Source`, positions)."""
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and not isinstance(
            inputs, Mapping)):
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        _expect(kind, "text", "texts")
        if tokenizer is None:
            raise Refusal("texts need tokenizer=: pass the model's tokenizer, or tokenized "
                             "inputs (a dict with input_ids and attention_mask)")
        _check_texts(texts)
        tokenized = tokenize_texts(tokenizer, texts, limit)
        width = max_length or max(len(ids) for ids in tokenized.ids)
        return tokenized, Source(texts, "in-memory texts", texts_sha256(texts)), width
    if not isinstance(inputs, Mapping):
        raise Refusal(f"inputs is a {type(inputs).__name__}: pass texts (a list of str with "
                         "tokenizer=), or a dict with input_ids [and attention_mask] or "
                         "pixel_values")
    if "pixel_values" in inputs:
        _expect(kind, "image", "pixel_values")
        _only(inputs, ("pixel_values",))
        if max_length is not None:
            raise Refusal("max_length applies to texts and token ids; an image makes as many "
                             "tokens as the model has patches (and CLS): leave it out")
        pixels = _pixels(inputs["pixel_values"])
        digest = hashlib.sha256(str(tuple(pixels.shape)).encode() + pixels.numpy().tobytes())
        return pixels, Source(range(len(pixels)), "in-memory pixel_values",
                              digest.hexdigest()), None
    if "input_ids" not in inputs:
        raise Refusal(f"inputs has no input_ids or pixel_values (keys: "
                         f"{', '.join(map(str, inputs)) or 'none'}); pass tokenized inputs")
    _expect(kind, "text", "input_ids")
    _only(inputs, ("input_ids", "attention_mask", "token_type_ids"))
    tokenized = token_rows(inputs, limit)
    _check_ids(model, tokenized)
    digest = hashlib.sha256(json.dumps(tokenized.ids).encode()).hexdigest()
    width = max_length or max(len(ids) for ids in tokenized.ids)
    return tokenized, Source(tokenized.ids, "in-memory token ids", digest), width


def _expect(kind: str, want: str, given: str) -> None:
    if kind != want:
        takes = "pixel_values" if kind == "image" else "texts or input_ids"
        raise Refusal(f"the model takes {kind} inputs ({takes}), not {given}")


def _only(inputs: Mapping, taken: tuple[str, ...]) -> None:
    for key in inputs:
        if key not in taken and key not in IGNORED_KEYS:
            raise Refusal(f"inputs['{key}'] is not taken: measure reads "
                             f"{' and '.join(taken)}; leave {key} out")
    types = inputs.get("token_type_ids")
    if types is not None and np.any(np.asarray(_as_numpy(types)) != 0):
        raise Refusal("token_type_ids marks a second segment; measure reads single "
                         "segments (as extract does): leave token_type_ids out")


def _check_texts(texts: list) -> None:
    if not texts:
        raise Refusal("no texts given; pass a list of str")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise Refusal(f"texts[{i}] is a {type(text).__name__}, not a str")
        if not text.strip():
            raise Refusal(f"texts[{i}] is empty; remove it (extract skips empty texts)")


def _as_numpy(x) -> np.ndarray | list:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x) if isinstance(x, np.ndarray) else x


def _rows(x, name: str) -> list[list[int]]:
    """A (B, T) tensor/array, one (T,) row, or a list of lists, as lists of ints."""
    x = _as_numpy(x)
    if isinstance(x, np.ndarray):
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.dtype.kind not in "iub":
            raise Refusal(f"{name} must be integers of shape (batch, tokens), not {x.dtype} "
                             f"{x.shape}")
        return x.astype(np.int64).tolist()
    rows = [list(r) for r in x] if x and isinstance(x[0], (list, tuple, np.ndarray)) else [list(x)]
    if not all(isinstance(v, (int, np.integer)) for r in rows for v in r):
        raise Refusal(f"{name} must hold integers")
    return [[int(v) for v in r] for r in rows]


def token_rows(inputs: Mapping, limit: int) -> Tokenized:
    """Each row's real tokens (its attention mask's one run of ones, left padding dropped),
    cut at ``limit`` (``truncated``); ValueError for a row without, or with split, tokens."""
    ids = _rows(inputs["input_ids"], "input_ids")
    masks = inputs.get("attention_mask")
    masks = None if masks is None else _rows(masks, "attention_mask")
    if masks is not None and [len(m) for m in masks] != [len(r) for r in ids]:
        raise Refusal("attention_mask and input_ids differ in shape; pass the tokenizer's "
                         "output unchanged")
    rows, truncated = [], []
    for i, row in enumerate(ids):
        if masks is not None:
            real = np.flatnonzero(masks[i])
            if not len(real):
                raise Refusal(f"attention_mask row {i} marks no real token; remove the row")
            if real[-1] - real[0] + 1 != len(real):
                raise Refusal(f"attention_mask row {i} has padding between real tokens "
                                 "(packed sequences?); pass one sequence per row")
            row = row[real[0]:real[-1] + 1]
        if not row:
            raise Refusal(f"input_ids row {i} is empty; remove it")
        truncated.append(len(row) > limit)
        rows.append(row[:limit])
    return Tokenized(ids=rows, truncated=truncated)


def _check_ids(model, tokenized: Tokenized) -> None:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", None)
    for i, row in enumerate(tokenized.ids):
        bad = [t for t in row if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise Refusal(f"input_ids row {i} holds id {bad[0]}, outside the model's "
                             f"vocabulary (0..{(vocab or 0) - 1}); tokenize with its tokenizer")


def _pixels(x):
    import torch

    pixels = torch.as_tensor(_as_numpy(x))
    if pixels.ndim != 4 or not pixels.is_floating_point():
        raise Refusal(f"pixel_values must be floats of shape (batch, channels, height, "
                         f"width), not {pixels.dtype} {tuple(pixels.shape)}")
    return pixels.float().contiguous()


def _config_special(model, token_ids: np.ndarray) -> np.ndarray:
    """(S, T) int8: 1 where the id is one the model's config names (bos, eos, pad, ...)."""
    ids = set()
    for name in CONFIG_SPECIAL:
        value = getattr(model.config, name, None)
        ids |= set(value) if isinstance(value, (list, tuple)) else {value}
    ids = [int(v) for v in ids if isinstance(v, (int, np.integer))]
    return (np.isin(token_ids, ids) & (token_ids >= 0)).astype(np.int8)


class Collector:
    """Measured rows gathered into (S, ...) float32 arrays, filled as they come (the in-memory
    :class:`~.batches.Collect`, where extract's is a shard file's chunk encoder)."""

    def __init__(self, rows: int):
        self.rows, self.filled, self.arrays = rows, 0, {}

    def add(self, batch: dict[str, np.ndarray]) -> None:
        n = len(next(iter(batch.values())))
        for name, x in batch.items():
            if name not in self.arrays:
                self.arrays[name] = np.empty((self.rows,) + x.shape[1:], dtype=np.float32)
            self.arrays[name][self.filled:self.filled + n] = x
        self.filled += n

    def finish(self) -> dict[str, np.ndarray]:
        return self.arrays

    def close(self) -> None:
        pass


def _warn_beyond_context(model, width: int, inputs: str) -> None:
    """A warning (not a refusal: the caller chose the inputs) past the model's context."""
    import warnings

    from ..loading.budget import check_context, context_length

    if inputs == "image" or getattr(model, "config", None) is None:
        return
    try:
        check_context(width, context_length(model.config), False, what="the inputs' length")
    except ValueError as exc:
        warnings.warn(str(exc).split("; use")[0] + "; positions past it are ones the model "
                      "never saw", UserWarning, stacklevel=3)
