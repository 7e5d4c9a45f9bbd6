"""Text corpora in, token batches out.

A *text spec* names where texts come from:

- ``path.jsonl``: one JSON object per line. The text is the field ``text_field``; by default
  ``text`` if the first record has it, else ``"Question: {question}\\nAnswer: {answer}"`` when the
  first record has string ``question`` and ``answer`` fields (GSM8K), else the first string field
  of the first record. The rule chosen on the first record applies to every record.
- ``path.parquet``: the same rule over the columns.
- ``path.txt``: if the file has a blank line, texts are paragraphs separated by blank lines;
  otherwise one text per line. Texts are stripped of surrounding whitespace.
- ``hf:NAME[:CONFIG]:SPLIT``: ``datasets.load_dataset(NAME, CONFIG, split=SPLIT)`` (SPLIT may carry
  a slice such as ``test[:100]``), same field rule.
- ``builtin``: prose chunks of CPython's reference documentation (``pydoc_data.topics``), no
  download. Its content follows the running Python version; the ``sha256`` records which.

Texts from files are kept verbatim (no stripping except ``.txt``); empty or whitespace-only texts are
skipped and counted. No torch here.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import builtin_texts
from attngeom.common.errors import Refusal

__all__ = [
    "TextSet", "Tokenized", "load_texts", "iter_records", "builtin_texts",
    "tokenize_texts", "batches", "pad_token_id",
]

SPEC_HELP = "use a .jsonl, .parquet or .txt path, hf:NAME[:CONFIG]:SPLIT, or builtin"
_HF_SPEC = re.compile(r"^hf:(?P<name>[^:\s]+)(?::(?P<config>[^:\s\[\]]+))?:(?P<split>[^:\s\[\]]+(?:\[[^\]\s]*\])?)$")
_GSM8K = ("question", "answer")


@dataclass(frozen=True)
class TextSet:
    """Selected texts and their provenance.

    Attributes
    ----------
    texts : list of str
        The non-empty texts, in source order.
    spec : str
        The spec they were loaded from.
    sha256 : str
        SHA-256 of ``json.dumps(texts, ensure_ascii=False)`` encoded as UTF-8.
    skipped_empty : int
        Empty or whitespace-only texts skipped.
    """

    texts: list[str]
    spec: str
    sha256: str
    skipped_empty: int

    kind = "text"                # what a model of this data takes (its ``inputs``)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Tokenized:
    """Token ids per text (special tokens included) and whether each was truncated."""

    ids: list[list[int]]
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice) -> "Tokenized":
        return Tokenized(self.ids[rows], self.truncated[rows])


@dataclass
class Sequences:
    """Per-sequence facts of measured inputs: what a shard stores besides the measurements."""

    token_ids: np.ndarray          # (S, T) int: token ids (-1 beyond length); an image's id
    lengths: np.ndarray            # (S,) tokens per sequence
    special: np.ndarray            # (S, T) int8: special tokens (images: those before patches)
    tokens: list[list[str]] | None # token strings (None: not stored)
    truncated: np.ndarray          # (S,) 1 where a text was cut (images: never)


def texts_sha256(texts: Sequence[str]) -> str:
    """Canonical hash of a list of texts (JSON list, UTF-8)."""
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------- records
def _check_file(path: Path) -> None:
    if not path.is_file():
        raise Refusal(f"text file not found: {path}; check the path ({SPEC_HELP})")


def _iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    offset = 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise Refusal(
                    f"{path} is not UTF-8: bad byte at offset {offset + exc.start} (line {lineno}); "
                    "re-encode the file as UTF-8") from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Refusal(f"{path} line {lineno} is not valid JSON ({exc.msg}); "
                                 "fix or remove that line (JSON Lines: one object per line)") from None
            if not isinstance(rec, dict):
                raise Refusal(f"{path} line {lineno} is a JSON {type(rec).__name__}, not an object; "
                                 "write one JSON object per line")
            yield f"line {lineno}", rec


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import pandas as pd
        frame = pd.read_parquet(path)
    except ImportError:
        raise Refusal("reading .parquet needs pyarrow; pip install pyarrow") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Refusal(f"{path} is not a readable parquet file ({first}); check the file") from None
    for row, rec in enumerate(frame.to_dict(orient="records"), start=1):
        yield f"row {row}", {str(k): v for k, v in rec.items()}


def _iter_hf(spec: str) -> Iterator[tuple[str, dict[str, Any]]]:
    m = _HF_SPEC.match(spec)
    if m is None:
        raise Refusal(f"malformed hf spec {spec!r}; write hf:NAME[:CONFIG]:SPLIT, "
                         "e.g. hf:openai/gsm8k:main:test")
    try:
        import datasets
    except ImportError:
        raise Refusal(f"{spec} needs the datasets library; pip install datasets") from None
    name, config, split = m["name"], m["config"], m["split"]
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - hub, config and split errors all end here
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Refusal(f"could not load {spec} ({first}); check NAME, CONFIG, SPLIT "
                         "and network access") from None
    for row, rec in enumerate(ds, start=1):
        yield f"row {row}", dict(rec)


def iter_records(spec: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` from a ``.jsonl``/``.parquet`` path or ``hf:`` spec.

    Parameters
    ----------
    spec : str
        Path or ``hf:NAME[:CONFIG]:SPLIT``.

    Yields
    ------
    where : str
        ``"line N"`` (JSONL, 1-based) or ``"row N"`` (parquet, hf), for error messages.
    record : dict
    """
    spec = str(spec)
    if spec.startswith("hf:"):
        yield from _iter_hf(spec)
        return
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise Refusal(f"unknown record file extension {path.suffix!r} for {spec}; "
                         "use a .jsonl or .parquet file or hf:NAME[:CONFIG]:SPLIT")
    _check_file(path)
    yield from (_iter_jsonl(path) if suffix == ".jsonl" else _iter_parquet(path))


def _pick_field(rec: dict[str, Any], where: str, spec: str) -> str:
    """The default text field rule, applied to the first record."""
    if isinstance(rec.get("text"), str):
        return "text"
    if all(isinstance(rec.get(k), str) for k in _GSM8K):
        return "question+answer"
    for key, value in rec.items():
        if isinstance(value, str):
            return key
    raise Refusal(f"{spec} {where}: record has no string field (fields: {', '.join(rec) or 'none'}); "
                     "pass text_field (--text-field) naming the text")


def _record_text(rec: dict[str, Any], field: str, where: str, spec: str) -> str:
    if field == "question+answer" and field not in rec:
        return f"Question: {_record_text(rec, 'question', where, spec)}\n" \
               f"Answer: {_record_text(rec, 'answer', where, spec)}"
    if field not in rec:
        raise Refusal(f"{spec} {where}: record has no field {field!r} (fields: {', '.join(rec)}); "
                         "pass text_field (--text-field) naming one of them")
    value = rec[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Refusal(f"{spec} {where}: field {field!r} is {type(value).__name__}, not text; "
                         "pass text_field (--text-field) naming a string field")
    return value


def _record_texts(spec: str, text_field: str | None) -> Iterator[str]:
    field = text_field
    for where, rec in iter_records(spec):
        if field is None:
            field = _pick_field(rec, where, spec)
        yield _record_text(rec, field, where, spec)


def _txt_texts(path: Path) -> Iterator[str]:
    _check_file(path)
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise Refusal(f"{path} is not UTF-8: bad byte at offset {exc.start} (line {line}); "
                         "re-encode the file as UTF-8") from None
    lines = content.splitlines()
    if any(not ln.strip() for ln in lines):
        yield from (p.strip() for p in re.split(r"\n[ \t\f\v]*\n", "\n".join(lines)))
    else:
        yield from (ln.strip() for ln in lines)


# ----------------------------------------------------------------------------------- load
def load_texts(spec: str, text_field: str | None = None, limit: int | None = None) -> TextSet:
    """Load texts from a spec (see the module docstring).

    Parameters
    ----------
    spec : str
        ``.jsonl``/``.parquet``/``.txt`` path, ``hf:NAME[:CONFIG]:SPLIT`` or ``builtin``.
    text_field : str, optional
        Record field holding the text (JSONL, parquet, hf). Default: see module docstring.
    limit : int, optional
        Keep at most this many non-empty texts (the first ones).

    Returns
    -------
    TextSet

    Raises
    ------
    ValueError
        One line naming the problem and the fix.
    """
    spec = str(spec)
    if limit is not None and limit < 0:
        raise Refusal(f"limit must be >= 0, got {limit}; pass a non-negative limit or None")
    if spec == "builtin":
        source: Iterator[str] = iter(builtin_texts())
    elif spec.startswith("hf:"):
        source = _record_texts(spec, text_field)
    else:
        suffix = Path(spec).suffix.lower()
        if suffix == ".txt":
            source = _txt_texts(Path(spec))
        elif suffix in (".jsonl", ".parquet"):
            source = _record_texts(spec, text_field)
        else:
            raise Refusal(f"unknown text spec {spec!r} (extension {suffix or 'none'!r}); {SPEC_HELP}")
    texts: list[str] = []
    skipped = 0
    for text in source:
        if limit is not None and len(texts) >= limit:
            break
        if text.strip():
            texts.append(text)
        else:
            skipped += 1
    return TextSet(texts=texts, spec=spec, sha256=texts_sha256(texts), skipped_empty=skipped)


# ----------------------------------------------------------------------------------- tokens
def tokenize_texts(tokenizer: Any, texts: Sequence[str], max_length: int,
                   bos: str = "auto") -> Tokenized:
    """Tokenize with the tokenizer's own special tokens (BOS where it adds one), truncating.

    ``bos``: ``"auto"`` (the tokenizer's special tokens), ``"no"`` (none:
    ``add_special_tokens=False``) or ``"yes"`` (the special tokens, and BOS first where the
    tokenizer does not put it there).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
    texts : sequence of str
    max_length : int
        Most tokens per text, special tokens included. Truncation follows the tokenizer
        (``truncation=True``), so special tokens such as BOS are kept.

    Returns
    -------
    Tokenized
    """
    if max_length < 1:
        raise Refusal(f"max_length must be >= 1, got {max_length}; pass a positive max_length")
    texts = list(texts)
    special = bos != "no"
    full = tokenizer(texts, add_special_tokens=special, truncation=False,
                     verbose=False)["input_ids"]
    if bos == "yes":
        first = getattr(tokenizer, "bos_token_id", None)
        if first is None:
            raise Refusal("--bos yes: this tokenizer has no BOS token; use --bos auto")
        full = [x if len(x) and x[0] == first else [first, *x] for x in full]
    long = [i for i, ids in enumerate(full) if len(ids) > max_length]
    ids = [list(map(int, x)) for x in full]
    if long and (bos == "yes" or cuts_by_slicing(tokenizer)):   # the same ids, encoded once
        for i in long:
            ids[i] = ids[i][:max_length]
    elif long:
        cut = tokenizer([texts[i] for i in long], add_special_tokens=special, truncation=True,
                        max_length=max_length, verbose=False)["input_ids"]
        for i, row in zip(long, cut):
            ids[i] = list(map(int, row))
    truncated = [len(x) > max_length for x in full]
    return Tokenized(ids=ids, truncated=truncated)


def cuts_by_slicing(tokenizer: Any) -> bool:
    """True when the tokenizer's own truncation of one text to N tokens keeps its first N ids:
    it truncates on the right and adds special tokens only in front (BOS), checked on a probe
    text. Then an over-long text's ids are cut from its full encoding instead of encoding it
    again with ``truncation=True``."""
    if getattr(tokenizer, "truncation_side", "right") != "right":
        return False
    try:
        plain = tokenizer("a b c", add_special_tokens=False)["input_ids"]
        special = tokenizer("a b c", add_special_tokens=True)["input_ids"]
    except Exception:                                # noqa: BLE001 - encode twice instead
        return False
    return len(special) >= len(plain) and list(special[len(special) - len(plain):]) == list(plain)


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its EOS id, else 0 (right padding is masked out anyway)."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


def batches(tokenized: Tokenized, batch_size: int, pad_id: int = 0,
            sort_by_length: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Right-padded batches, padded to the longest sequence in each batch.

    Position 0 of every row is the first real token (the attention sink).

    Parameters
    ----------
    tokenized : Tokenized
    batch_size : int
    pad_id : int
        Id written into padded positions (masked out by ``attention_mask``).
    sort_by_length : bool
        Group texts by descending length (stable) to reduce padding; ``index`` maps rows back.

    Yields
    ------
    dict
        ``input_ids`` (B, T) int64, ``attention_mask`` (B, T) int64 (1 = real token),
        ``index`` (B,) int64: positions of the rows in ``tokenized``.
    """
    if batch_size < 1:
        raise Refusal(f"batch_size must be >= 1, got {batch_size}; pass a positive batch_size")
    order = list(range(len(tokenized.ids)))
    if sort_by_length:
        order.sort(key=lambda i: -len(tokenized.ids[i]))
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        rows = [tokenized.ids[i] for i in index]
        width = max(len(r) for r in rows)
        input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)     # (B, T)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)      # (B, T)
        for b, row in enumerate(rows):
            input_ids[b, :len(row)] = row
            attention_mask[b, :len(row)] = 1
        yield {"input_ids": input_ids, "attention_mask": attention_mask,
               "index": np.asarray(index, dtype=np.int64)}
