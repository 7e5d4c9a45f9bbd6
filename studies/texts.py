"""Inputs of the second study, selected with the model's own tokenizer (studies/README.md).

- Prose (design 1 and 2): one text per OpenStax section (one record of the file), only sections
  whose tokenization (the tokenizer's own special tokens included, as ``attngeom faithfulness``
  tokenizes) reaches ``length`` tokens; the faithfulness run cuts them at ``--max-length
  length``. Sections are taken round-robin over the book's modules (first section of every
  module, then the second, ...) so that the first 64 span the whole book.
- GSM8K: "Question: q\\nAnswer: a" (the text ``attngeom faithfulness`` forms from a GSM8K
  record), only items with ``low`` to ``length`` tokens after the cut at ``length``, in file order.
- Gu et al.'s sink protocol: ``length``-token inputs of natural text (WikiText-2 chunks, first
  ``length`` tokens), random tokens uniform over the non-special vocabulary, and one random token
  repeated; with or without the tokenizer's BOS in front (then BOS + ``length`` - 1 tokens).

The selected texts are written verbatim (JSON Lines ``{"text", "source", "tokens"}``): the
faithfulness command re-tokenizes them exactly as here.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

import prepare
from attngeom.extract.loading.probes import Probe, probe_ids


def token_lengths(tok, texts: list[str], special: bool = True) -> np.ndarray:
    """Untruncated token counts (with the tokenizer's special tokens when ``special``)."""
    ids = tok(list(texts), add_special_tokens=special, truncation=False, verbose=False)
    return np.array([len(x) for x in ids["input_ids"]], dtype=int)


def prose_texts(tok, src: str | Path, out: Path, n: int, length: int = 128,
                group_field: str = "module", skip: int = 0) -> int:
    """Write the first ``n`` sections (round-robin over ``group_field``) reaching ``length``
    tokens to ``out``, after leaving out the first ``skip`` of that order (a pilot's); return
    how many (fewer when the file has fewer)."""
    records = prepare.read_jsonl(src)
    texts = [prepare.text_of(r, "text") for r in records]
    lengths = token_lengths(tok, texts)
    groups: OrderedDict[str, list] = OrderedDict()
    for i, (rec, text, k) in enumerate(zip(records, texts, lengths)):
        if k >= length and text.strip():
            groups.setdefault(str(rec.get(group_field, i)), []).append(
                {"text": text, "source": i, "tokens": int(k)})
    picked = prepare.round_robin(list(groups.values()), skip + n)[skip:]
    prepare.write_jsonl(picked, out)
    return len(picked)


def gsm8k_text(rec: dict) -> str:
    """The text ``attngeom faithfulness`` forms from a GSM8K record (extract/loading/data.py)."""
    return f"Question: {rec['question']}\nAnswer: {rec['answer']}"


def gsm8k_texts(tok, src: str | Path, out: Path, n: int, low: int = 96,
                length: int = 128) -> int:
    """Write the first ``n`` GSM8K items with ``low``..``length`` tokens after the cut."""
    records = prepare.read_jsonl(src)
    texts = [gsm8k_text(r) for r in records]
    lengths = token_lengths(tok, texts)
    picked = [{"text": t, "source": i, "tokens": int(k)}
              for i, (t, k) in enumerate(zip(texts, lengths)) if min(k, length) >= low][:n]
    prepare.write_jsonl(picked, out)
    return len(picked)


# --------------------------------------------------------------------- Gu et al. inputs
def adds_bos(tok) -> bool:
    """True when the tokenizer puts its BOS in front of a text by default (Gemma; not SmolLM2)."""
    with_special = tok("a b", add_special_tokens=True)["input_ids"]
    plain = tok("a b", add_special_tokens=False)["input_ids"]
    bos = getattr(tok, "bos_token_id", None)
    return bos is not None and len(with_special) > len(plain) and with_special[0] == bos


def with_bos(ids: np.ndarray, bos_id: int | None) -> np.ndarray:
    """BOS + the first T - 1 tokens of each row (unchanged when ``bos_id`` is None)."""
    if bos_id is None:
        return ids
    return np.concatenate([np.full((len(ids), 1), bos_id, dtype=ids.dtype), ids[:, :-1]], 1)


def natural_inputs(tok, wikitext: str | Path, n: int, length: int = 64,
                   bos: bool = True, chunk_chars: int = 1400) -> np.ndarray:
    """(n, length) ids of WikiText-2 chunks (round-robin over articles), tokenized with the
    tokenizer's special tokens when ``bos`` (its default), else without; chunks shorter than
    ``length`` tokens are skipped. Fewer rows when the file runs out."""
    groups = [prepare.chunk_text(prepare.text_of(r, "text"), chunk_chars)
              for r in prepare.read_jsonl(wikitext)]
    chunks = prepare.round_robin(groups, sum(len(g) for g in groups))
    rows = []
    for text in chunks:
        ids = tok(text, add_special_tokens=bos, truncation=False, verbose=False)["input_ids"]
        if len(ids) >= length:
            rows.append(ids[:length])
        if len(rows) == n:
            break
    return np.array(rows, dtype=np.int64).reshape(len(rows), length)


def random_inputs(tok, n: int, length: int = 64, seed: int = 0,
                  bos_id: int | None = None) -> np.ndarray:
    """(n, length) ids drawn uniformly from the non-special vocabulary (the package's probe)."""
    return with_bos(probe_ids(Probe("random", length, n, seed), tok), bos_id)


def repeated_inputs(tok, n: int, length: int = 64, seed: int = 0,
                    bos_id: int | None = None) -> np.ndarray:
    """(n, length): row r is one random non-special token repeated ``length`` times."""
    return with_bos(probe_ids(Probe("repeated", length, n, seed), tok), bos_id)


def chunk_ids(tok, chunks: str | Path, n: int, max_length: int) -> np.ndarray:
    """(n, T) ids of the first ``n`` chunk records cut to their common length (at most
    ``max_length``): a batch as ``attngeom extract`` sees it, for timing."""
    rows = [tok(r["text"], truncation=True, max_length=max_length)["input_ids"]
            for r in prepare.read_jsonl(chunks)[:n]]
    T = min(len(r) for r in rows)
    return np.array([r[:T] for r in rows], dtype=np.int64)
