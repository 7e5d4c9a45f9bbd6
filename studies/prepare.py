"""Input preparation of the studies: deterministic, diverse samples of the evaluation files.

- Geometry texts: long articles (WikiText-2) are cut at line boundaries into chunks of about
  ``chunk_chars`` characters; chunks are taken round-robin over the articles (first chunk of every
  article, then the second, ...) until ``limit``, so a small sample covers every article.
- Multiple-choice items: round-robin over a grouping field (MMLU ``subject``), else the file order,
  so 2 items per subject cover all 57 MMLU subjects instead of the first two subjects.

Only the standard library: the study driver runs this before any model is loaded.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSON Lines file (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(records: list[dict], path: Path) -> Path:
    """Write ``records`` atomically; a file already holding the same lines is left untouched.

    The temporary name carries the process id, so two study steps started at once (each preparing
    the same inputs) never rename each other's file away.
    """
    text = "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def text_of(rec: dict, field: str | None) -> str:
    """The record's text: ``field`` if given and present, else ``text``, else the first string."""
    for key in ([field] if field else []) + ["text"]:
        if isinstance(rec.get(key), str):
            return rec[key]
    for value in rec.values():
        if isinstance(value, str):
            return value
    raise ValueError(f"record has no string field ({', '.join(rec)}); pass --geo-text-field")


def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Consecutive chunks of whole lines, each at least ``chunk_chars`` long (the last may be
    shorter; it is kept only if it is at least half that long or the only chunk)."""
    chunks, current = [], ""
    for line in text.splitlines(keepends=True):
        current += line
        if len(current) >= chunk_chars:
            chunks.append(current.strip())
            current = ""
    if current.strip() and (len(current) >= chunk_chars // 2 or not chunks):
        chunks.append(current.strip())
    return [c for c in chunks if c]


def round_robin(groups: list[list], limit: int) -> list:
    """First element of every group, then the second, ... until ``limit`` elements."""
    out, depth = [], 0
    while len(out) < limit and any(depth < len(g) for g in groups):
        out += [g[depth] for g in groups if depth < len(g)][: limit - len(out)]
        depth += 1
    return out


def geometry_texts(src: str | Path, out: Path, limit: int, chunk_chars: int,
                   field: str | None = None) -> int:
    """Write ``limit`` chunk records ``{"text", "source"}`` to ``out``; return how many."""
    groups = []
    for n, rec in enumerate(read_jsonl(src)):
        chunks = chunk_text(text_of(rec, field), chunk_chars)
        groups.append([{"text": c, "source": f"{n}:{k}"} for k, c in enumerate(chunks)])
    picked = round_robin(groups, limit)
    write_jsonl(picked, out)
    return len(picked)


def task_items(src: str | Path, out: Path, limit: int, group_field: str | None = None) -> int:
    """Write ``limit`` records of ``src`` to ``out``, round-robin over ``group_field``."""
    records = read_jsonl(src)
    if group_field and records and group_field in records[0]:
        groups: OrderedDict[str, list] = OrderedDict()
        for rec in records:
            groups.setdefault(str(rec.get(group_field)), []).append(rec)
        picked = round_robin(list(groups.values()), limit)
    else:
        picked = records[:limit]
    write_jsonl(picked, out)
    return len(picked)
