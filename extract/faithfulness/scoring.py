"""What a faithfulness run scores: model rows, the token spans read from their logits, units.

A *unit* is what statistics replicate over: a text (language modelling, perplexity over every
predicted position), a GSM8K question (NLL of the answer given the question) or a multiple-choice
item (log P(continuation_c | context_c) per option c, prediction = arg-max, ties to the first
option). A *span* is a list of target tokens of one row: token m is scored from the logits at
position ``start + m - 1``. Multiple-choice items whose options share one context and whose
continuations are single tokens (MMLU letters, BoolQ yes/no) use one row for all options.

Context + continuation pairs are tokenized separately (the tokenizer's leading special tokens,
e.g. BOS, kept; trailing ones such as EOS dropped) and cut to ``max_length`` when together they
are longer: the continuation keeps its first tokens, the context its last ones (after the
leading special tokens); each side keeps at least half of the room if it needs it, a shorter
side keeps everything and leaves the rest to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attngeom.common import tasks

from ..loading.data import texts_sha256, tokenize_texts
from attngeom.common.errors import Refusal

LOGIT_CHUNK = 1024          # logit positions per log-softmax (memory bound: chunk x vocabulary)


@dataclass
class Prepared:
    """Rows to run and spans to score, for ``n_units`` units.

    Attributes
    ----------
    rows : token ids per model row. span_row, span_start, span_unit, span_option : (S,) int.
    span_tokens : target token ids per span. kind : ``"lm"`` or ``"choice"``.
    answer : (n_units,) correct option (choice) or None. n_options : options per item (1: lm).
    unit : per-unit extras (``truncated``, ``length`` ...) as arrays of length ``n_units``.
    """

    rows: list[list[int]]
    span_row: np.ndarray
    span_start: np.ndarray
    span_tokens: list[list[int]]
    span_unit: np.ndarray
    span_option: np.ndarray
    kind: str
    n_units: int
    n_options: int = 1
    answer: np.ndarray | None = None
    unit: dict[str, np.ndarray] = field(default_factory=dict)

    def subset(self, start: int, stop: int) -> "Prepared":
        """Units [start, stop) with their rows and spans, rows renumbered from 0."""
        keep = (self.span_unit >= start) & (self.span_unit < stop)
        rows = sorted(set(self.span_row[keep].tolist()))
        new = {r: i for i, r in enumerate(rows)}
        return Prepared(
            rows=[self.rows[r] for r in rows],
            span_row=np.array([new[r] for r in self.span_row[keep]], dtype=np.int64),
            span_start=self.span_start[keep],
            span_tokens=[t for t, k in zip(self.span_tokens, keep) if k],
            span_unit=self.span_unit[keep] - start, span_option=self.span_option[keep],
            kind=self.kind, n_units=stop - start, n_options=self.n_options,
            answer=None if self.answer is None else self.answer[start:stop],
            unit={k: v[start:stop] for k, v in self.unit.items()})


def _spans(rows, entries, kind, n_units, n_options=1, answer=None, unit=None) -> Prepared:
    """entries: (row, start, tokens, unit, option)."""
    r, s, t, u, o = zip(*entries) if entries else ((), (), (), (), ())
    as_int = lambda x: np.asarray(x, dtype=np.int64)            # noqa: E731
    return Prepared(rows, as_int(r), as_int(s), [list(x) for x in t], as_int(u), as_int(o), kind,
                    n_units, n_options, answer, unit or {})


# ------------------------------------------------------------------------------------ encoding
def special_prefix(tok, text: str) -> tuple[list[int], list[int]]:
    """(leading special ids the tokenizer adds, body ids) of ``text``."""
    body = list(tok(text, add_special_tokens=False)["input_ids"])
    full = list(tok(text, add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(body) + 1):
        if full[i:i + len(body)] == body:
            return full[:i], body
    return [], body


def encode_pair(tok, context: str, continuation: str, max_length: int
                ) -> tuple[list[int], int, bool]:
    """(ids, n_context, truncated): ``ids[n_context:]`` are the continuation's tokens."""
    prefix, body = special_prefix(tok, context)
    cont = list(tok(continuation, add_special_tokens=False)["input_ids"])
    if not cont:
        raise Refusal(f"continuation {continuation!r} has no tokens; check the task data")
    if not prefix and not body:
        raise Refusal("empty context: the first continuation token has nothing to be "
                         "predicted from; check the task data")
    room = max_length - len(prefix)
    if room < (1 if prefix else 2):
        raise Refusal(f"--max-length {max_length} leaves no room for context and "
                         "continuation; raise --max-length")
    n_cont = len(cont)
    if len(body) + len(cont) > room:        # each side gets at least half the room if it needs it
        half = max(1, room // 2) if prefix else max(1, min(room - 1, room // 2))
        n_cont = (len(cont) if len(cont) <= half else
                  max(half, room - len(body)))
    keep_cont = cont[:n_cont]
    n_body = min(len(body), room - len(keep_cont))
    keep_body = body[len(body) - n_body:]
    truncated = len(keep_cont) < len(cont) or len(keep_body) < len(body)
    ids = prefix + keep_body + keep_cont
    return ids, len(ids) - len(keep_cont), truncated


def _context_ids(tok, context: str, max_length: int) -> tuple[list[int], bool]:
    prefix, body = special_prefix(tok, context)
    room = max_length - len(prefix)
    if room < 1 and not prefix:
        raise Refusal(f"--max-length {max_length} is too small; raise it")
    kept = body[max(0, len(body) - room):]
    return prefix + kept, len(kept) < len(body)


# ------------------------------------------------------------------------------------ tasks
def prepare_texts(tok, texts: list[str], max_length: int) -> Prepared:
    """Language modelling: every position after the first is predicted."""
    tokenized = tokenize_texts(tok, texts, max_length)
    entries = [(i, 1, ids[1:], i, 0) for i, ids in enumerate(tokenized.ids) if len(ids) > 1]
    lengths = np.array([len(ids) for ids in tokenized.ids])
    return _spans(tokenized.ids, entries, "lm", len(texts),
                  unit={"length": lengths, "truncated": np.array(tokenized.truncated, int)})


def prepare_answers(tok, items, max_length: int) -> Prepared:
    """GSM8K answer-only: the NLL of ``item.continuation`` given ``item.context``."""
    rows, entries, trunc = [], [], []
    for i, item in enumerate(items):
        ids, n_ctx, cut = encode_pair(tok, item.context, item.continuation, max_length)
        rows.append(ids)
        entries.append((i, n_ctx, ids[n_ctx:], i, 0))
        trunc.append(int(cut))
    return _spans(rows, entries, "lm", len(items),
                  unit={"length": np.array([len(r) for r in rows]),
                        "truncated": np.array(trunc, int)})


def prepare_choices(tok, items, max_length: int) -> Prepared:
    """Multiple choice: one span per option; shared single-token options share one row."""
    rows, entries, trunc = [], [], []
    n_options = max(len(it.contexts) for it in items)
    for u, item in enumerate(items):
        conts = [list(tok(c, add_special_tokens=False)["input_ids"]) for c in item.continuations]
        if len(set(item.contexts)) == 1 and all(len(c) == 1 for c in conts):
            ids, cut = _context_ids(tok, item.contexts[0], max_length)
            rows.append(ids)
            entries += [(len(rows) - 1, len(ids), c, u, o) for o, c in enumerate(conts)]
        else:
            cut = False
            for o, (ctx, cont) in enumerate(zip(item.contexts, item.continuations)):
                ids, n_ctx, c = encode_pair(tok, ctx, cont, max_length)
                rows.append(ids)
                entries.append((len(rows) - 1, n_ctx, ids[n_ctx:], u, o))
                cut |= c
        trunc.append(int(cut))
    answer = np.array([it.answer for it in items], dtype=np.int64)
    n_opts = np.array([len(it.contexts) for it in items], dtype=np.int64)
    return _spans(rows, entries, "choice", len(items), n_options, answer,
                  unit={"truncated": np.array(trunc, int), "n_options": n_opts})


# what a task's data holds (attngeom/common/tasks.py) -> how it is prepared for scoring
PREPARE = {tasks.TEXTS: prepare_texts, tasks.ANSWER: prepare_answers,
           tasks.CHOICE: prepare_choices}


def items_sha256(items) -> str:
    """Content hash of task items (their public fields, as JSON)."""
    return texts_sha256([repr(sorted(vars(it).items())) for it in items])


# ------------------------------------------------------------------------------------ scoring
def span_logprobs(logits: torch.Tensor, rows: np.ndarray, starts: np.ndarray,
                  tokens: list[list[int]]) -> np.ndarray:
    """Sum of log P(token) over each span: (n_spans,) float64.

    Parameters
    ----------
    logits : (B, T, V); rows : (S,) batch row of each span; starts : (S,) position of the
    span's first target token (scored from the logits at ``start - 1``).
    """
    if len(rows) == 0:
        return np.zeros(0)
    lengths = np.array([len(t) for t in tokens])
    span = np.repeat(np.arange(len(rows)), lengths)
    offset = np.concatenate([np.arange(n) for n in lengths])
    pos = np.repeat(starts, lengths) + offset - 1
    if (pos < 0).any() or (pos >= logits.shape[1]).any():
        raise ValueError("a scored token lies outside its row; check the spans")
    row = np.repeat(rows, lengths)
    t = torch.as_tensor(np.concatenate(tokens).astype(np.int64), device=logits.device)
    per_token = np.empty(len(pos))
    # each row's positions through views of the logits: a gathered (n, V) copy costs more
    # than the log-softmax itself
    for r in np.unique(row):
        at = np.flatnonzero(row == r)
        lo, hi = int(pos[at].min()), int(pos[at].max()) + 1
        for c0 in range(lo, hi, LOGIT_CHUNK):
            sel = at[(pos[at] >= c0) & (pos[at] < c0 + LOGIT_CHUNK)]
            if len(sel) == 0:
                continue
            view = logits[int(r), c0:min(hi, c0 + LOGIT_CHUNK)].float()         # (n, V)
            where = torch.as_tensor(pos[sel] - c0, device=logits.device)
            lp = torch.log_softmax(view, dim=-1)[where, t[torch.as_tensor(sel)]]
            per_token[sel] = lp.double().cpu().numpy()
    return np.bincount(span, weights=per_token, minlength=len(rows))


def unit_scores(prepared: Prepared, lp: np.ndarray) -> dict[str, np.ndarray]:
    """Per-unit results from the spans' log-probs (..., S) of one or more conditions.

    Returns ``ppl`` and ``nll`` (..., U) for ``lm``; ``logprob`` (..., U, O) and ``correct``
    (..., U) for ``choice``.
    """
    lead = lp.shape[:-1]
    if prepared.kind == "lm":
        n_tok = np.array([len(t) for t in prepared.span_tokens], dtype=float)
        nll = np.full(lead + (prepared.n_units,), np.nan)
        nll[..., prepared.span_unit] = -lp / n_tok
        return {"nll": nll, "ppl": np.exp(nll)}
    logprob = np.full(lead + (prepared.n_units, prepared.n_options), -np.inf)
    logprob[..., prepared.span_unit, prepared.span_option] = lp
    correct = (np.argmax(logprob, axis=-1) == prepared.answer).astype(np.int8)
    logprob[np.isneginf(logprob)] = np.nan                          # options an item lacks
    return {"logprob": logprob, "correct": correct}
