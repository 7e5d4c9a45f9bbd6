"""The built-in corpus: prose from CPython's own reference documentation (no download).

``pydoc_data.topics`` ships with every CPython; topics are taken in alphabetical order,
headings, code, grammar rules and tables are dropped, and paragraphs are joined into texts
of at least ``min_words`` words. The content depends on the Python version; the store
records the texts' sha256.
"""

from __future__ import annotations

import re

_HEADING_RULE = re.compile(r"^([*=\-~^\"'`#+])\1{2,}\s*$")
_WORD = re.compile(r"^[(\"'“‘]*[A-Za-z][A-Za-z'’-]*[)\"'”’.,;:?!]*$")


def _is_prose(par: str) -> bool:
    """Heuristic: a paragraph of running English, not code, grammar, or a table."""
    if any(s in par for s in (">>>", "::=", "+--", "|", "-[ ")):
        return False
    tokens = par.split()
    if len(tokens) < 12 or par.rstrip()[-1] not in ".:;?!)\"":
        return False
    return sum(bool(_WORD.match(t)) for t in tokens) / len(tokens) >= 0.75


def _clean(par: str) -> str:
    lines = [re.sub(r"^\s*(?:[*\-]|\d+\.)\s+", "", ln) for ln in par.splitlines()]
    text = " ".join(ln.strip() for ln in lines)
    text = re.sub(r"\*{1,2}([^*\s][^*]*?)\*{1,2}", r"\1", text)   # *emphasis*, **strong**
    text = re.sub(r"\s*\[\d+\]", "", text)             # footnote references
    return re.sub(r"\s+", " ", text).strip()


def _topic_paragraphs(doc: str) -> list[str]:
    lines = doc.splitlines()
    kept: list[str] = []
    for i, line in enumerate(lines):
        if _HEADING_RULE.match(line) or (i + 1 < len(lines) and _HEADING_RULE.match(lines[i + 1])
                                         and line.strip() and not line[0].isspace()):
            kept.append("")          # drop headings and their rules
        else:
            kept.append(line)
    pars = re.split(r"\n\s*\n", "\n".join(kept))
    return [_clean(p) for p in pars if p.strip() and _is_prose(p)]


def builtin_texts(min_words: int = 200) -> list[str]:
    """Prose chunks of the Python reference documentation, in topic-name order.

    Each topic of ``pydoc_data.topics`` is reduced to its prose paragraphs (headings, code,
    grammar rules and tables dropped; markup and footnote marks removed), and consecutive
    paragraphs are joined (blank-line separated) into chunks of at least ``min_words`` words.
    A short remainder joins the topic's previous chunk; a topic with too little prose is dropped.
    A paragraph already used by an earlier topic is skipped (topics overlap).
    """
    from pydoc_data.topics import topics

    chunks: list[str] = []
    seen: set[str] = set()       # topics overlap (e.g. "compound" holds "if"): keep the first copy
    for key in sorted(topics):
        current: list[str] = []
        n_words, first = 0, len(chunks)
        for par in _topic_paragraphs(topics[key]):
            if par in seen:
                continue
            seen.add(par)
            current.append(par)
            n_words += len(par.split())
            if n_words >= min_words:
                chunks.append("\n\n".join(current))
                current, n_words = [], 0
        if current and len(chunks) > first:
            chunks[-1] = "\n\n".join([chunks[-1], *current])
    return chunks
