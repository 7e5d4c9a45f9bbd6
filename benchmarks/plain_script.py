"""The plain script a researcher writes instead of ``attngeom extract``: load, tokenize, forward.

Imports torch and transformers only (not attngeom). Loads a model directory with
``AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32, attn_implementation=ATTN)``
(``--attn sdpa``, transformers' default, or ``eager``) and its tokenizer, reads the texts of a
JSONL file (the ``text`` field; empty or whitespace-only texts skipped, then the first
``--limit``), tokenizes them as ``attngeom extract`` does (the tokenizer's own special tokens,
truncated to ``--max-length`` by the tokenizer, right-padded to each batch's longest text with the
tokenizer's pad id, else its EOS id, else 0) and runs them through the model in batches of
``--batch-size`` in data order, under ``torch.inference_mode()`` with ``use_cache=False`` (full
logits). Prints one JSON line: ``tokens`` (real tokens, padding excluded), ``seconds`` (the
forward passes), ``load_s`` (model and tokenizer), ``total_s`` (from the first import), and
``ids_sha256`` (the token ids, each text's own, as a JSON list of lists: what benchmarks compare
with a store's ``token_id``).

    python benchmarks/plain_script.py --model DIR --data FILE.jsonl --limit 16 \\
        --max-length 512 --batch-size 2 --attn sdpa

``benchmarks/bench_command.py`` runs it as a fresh process next to ``attngeom extract``.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def read_texts(path: str, limit: int | None) -> list[str]:
    """The ``text`` field of each JSONL record, empty texts skipped, the first ``limit``."""
    texts = []
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            if limit is not None and len(texts) >= limit:
                break
            if line.strip() and (text := json.loads(line).get("text") or "").strip():
                texts.append(text)
    return texts


def encode(tok, texts: list[str], max_length: int, batch_size: int) -> list[dict]:
    """Batches of ``batch_size`` texts in data order: ``input_ids`` and ``attention_mask``
    (B, T) int64, right-padded to the batch's longest text."""
    if tok.pad_token is None:                     # the usual fix: pad with EOS (masked out)
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.convert_ids_to_tokens(0)
    tok.padding_side = "right"
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tok(texts[i:i + batch_size], truncation=True, max_length=max_length,
                  padding=True, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


def token_ids(batches: list[dict]) -> list[list[int]]:
    """Each text's own token ids (padding removed)."""
    return [row[mask.bool()].tolist() for b in batches
            for row, mask in zip(b["input_ids"], b["attention_mask"])]


def ids_sha256(ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model directory (config.json, weights)")
    p.add_argument("--data", required=True, help="a JSONL file with a 'text' field")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    a = p.parse_args(argv)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation=a.attn).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    load_s = time.perf_counter() - t
    batches = encode(tok, read_texts(a.data, a.limit), a.max_length, a.batch_size)
    t = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            model(**b, use_cache=False)
    seconds = time.perf_counter() - t
    ids = token_ids(batches)
    print(json.dumps({"attn": a.attn, "tokens": sum(map(len, ids)), "seconds": seconds,
                      "load_s": load_s, "total_s": time.perf_counter() - T0,
                      "threads": torch.get_num_threads(), "ids_sha256": ids_sha256(ids)}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
