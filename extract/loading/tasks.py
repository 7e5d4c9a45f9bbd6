"""Evaluation task loaders: MMLU, WinoGrande, BoolQ (multiple choice) and GSM8K (answer NLL).

Every loader takes a ``.jsonl``/``.parquet`` path or an ``hf:NAME[:CONFIG]:SPLIT`` spec and reads
both the layouts of ``shared/data`` and those of the Hugging Face originals. Multiple-choice items
are :class:`ChoiceItem`: option ``c`` is scored as ``log P(continuations[c] | contexts[c])`` and the
prediction is the arg-max (no length normalisation needed: MMLU and BoolQ continuations are one
word, WinoGrande's continuation is shared by both options). Prompt formats follow
lm-evaluation-harness. No torch here.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .data import iter_records
from attngeom.common.errors import Refusal

__all__ = ["ChoiceItem", "AnswerItem", "mmlu_items", "winogrande_items", "boolq_items", "gsm8k_items"]

LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class ChoiceItem:
    """One multiple-choice item.

    Attributes
    ----------
    contexts : list of str
        Context of each option (the same prompt repeated for MMLU and BoolQ).
    continuations : list of str
        Text scored after each context.
    answer : int
        Index of the correct option.
    id : str
        Source id (or ``"<where>"`` in the file).
    group : str
        Sub-task (MMLU subject), else ``""``.
    """

    contexts: list[str]
    continuations: list[str]
    answer: int
    id: str = ""
    group: str = ""

    def __post_init__(self) -> None:
        n = len(self.contexts)
        if n < 2 or len(self.continuations) != n or not 0 <= self.answer < n:
            raise Refusal(f"bad ChoiceItem {self.id!r}: {n} contexts, {len(self.continuations)} "
                             f"continuations, answer {self.answer}; give >= 2 options and a valid answer")

    @property
    def prompt(self) -> str:
        """The shared context (MMLU, BoolQ)."""
        if len(set(self.contexts)) != 1:
            raise AttributeError("this item has one context per option; use .contexts")
        return self.contexts[0]

    @property
    def choices(self) -> list[str]:
        """Alias of ``continuations``."""
        return self.continuations

    @property
    def continuation(self) -> str:
        """The shared continuation (WinoGrande)."""
        if len(set(self.continuations)) != 1:
            raise AttributeError("this item has one continuation per option; use .continuations")
        return self.continuations[0]


@dataclass(frozen=True)
class AnswerItem:
    """A question with its reference answer, scored by the answer's NLL (GSM8K).

    ``context`` is ``"Question: {question}\\nAnswer:"`` and ``continuation`` is ``" " + answer``
    (the full worked solution, ending with ``#### N``).
    """

    question: str
    answer: str
    id: str = ""

    @property
    def context(self) -> str:
        return f"Question: {self.question}\nAnswer:"

    @property
    def continuation(self) -> str:
        return " " + self.answer

    @property
    def final_answer(self) -> str | None:
        """The number after ``####``, commas removed, or None."""
        m = re.search(r"####\s*(.+?)\s*$", self.answer)
        return m.group(1).replace(",", "") if m else None


def _fail(spec: str, where: str, problem: str, fix: str) -> ValueError:
    return ValueError(f"{spec} {where}: {problem}; {fix}")


def _field(rec: dict[str, Any], keys: Sequence[str], spec: str, where: str, task: str) -> Any:
    for key in keys:
        if key in rec and rec[key] is not None:
            return rec[key]
    raise _fail(spec, where, f"no field {' or '.join(map(repr, keys))} (fields: {', '.join(rec)})",
                f"pass a {task} file in the shared/data or Hugging Face layout")


def _limited(records: Iterator[tuple[str, dict[str, Any]]], limit: int | None
             ) -> Iterator[tuple[str, dict[str, Any]]]:
    for n, item in enumerate(records):
        if limit is not None and n >= limit:
            return
        yield item


# ----------------------------------------------------------------------------------- MMLU
def _mmlu_record(rec: dict[str, Any], spec: str, where: str) -> tuple[str, str, list[str], int]:
    question = str(_field(rec, ["question"], spec, where, "MMLU")).strip()
    subject = str(rec.get("subject") or "")
    if "choices" in rec:
        choices = [str(c) for c in rec["choices"]]
    elif "choice0" in rec:
        choices = [str(rec[f"choice{i}"]) for i in range(len(LETTERS)) if f"choice{i}" in rec]
    else:
        choices = [str(rec[k]) for k in LETTERS if k in rec]
    if len(choices) < 2:
        raise _fail(spec, where, f"no choices (fields: {', '.join(rec)})",
                    "give `choices` (list) or choice0..choice3")
    raw = _field(rec, ["answer", "label"], spec, where, "MMLU")
    if isinstance(raw, str) and raw.strip().upper() in LETTERS[:len(choices)]:
        answer = LETTERS.index(raw.strip().upper())
    elif isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(choices):
        answer = int(raw)
    else:
        raise _fail(spec, where, f"answer {raw!r} is not an index 0-{len(choices) - 1} or a letter",
                    "fix the answer field")
    return subject, question, choices, answer


def _mmlu_block(question: str, choices: list[str]) -> str:
    lines = [question] + [f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)]
    return "\n".join(lines) + "\nAnswer:"


def mmlu_items(path_or_spec: str, dev: str | None = None, k_shot: int = 5,
               limit: int | None = None, subjects: Sequence[str] | None = None) -> list[ChoiceItem]:
    """MMLU items scored by answer letter.

    Parameters
    ----------
    path_or_spec : str
        Test records: ``subject, question, choice0..3, answer`` (shared/data) or
        ``question, subject, choices, answer`` (``hf:cais/mmlu:all:test``).
    dev : str, optional
        Exemplar records in the same layouts; the first ``k_shot`` of the item's subject are used.
        None gives zero-shot prompts.
    k_shot : int
        Exemplars per prompt (fewer if the subject has fewer in ``dev``).
    limit : int, optional
        Most items (after the subject filter).
    subjects : sequence of str, optional
        Keep only these subjects.

    Returns
    -------
    list of ChoiceItem
        ``prompt`` = header, exemplars (each ending ``Answer: X``) and the question ending
        ``Answer:``; continuations ``[" A", " B", " C", " D"]``; ``group`` = subject.
    """
    if k_shot < 0:
        raise Refusal(f"k_shot must be >= 0, got {k_shot}; pass a non-negative k_shot")
    shots: dict[str, list[str]] = defaultdict(list)
    if dev is not None:
        for where, rec in iter_records(dev):
            subject, question, choices, answer = _mmlu_record(rec, dev, where)
            if len(shots[subject]) < k_shot:
                shots[subject].append(f"{_mmlu_block(question, choices)} {LETTERS[answer]}\n\n")
    keep = set(subjects) if subjects is not None else None
    items: list[ChoiceItem] = []
    for where, rec in iter_records(path_or_spec):
        if limit is not None and len(items) >= limit:
            break
        subject, question, choices, answer = _mmlu_record(rec, path_or_spec, where)
        if keep is not None and subject not in keep:
            continue
        header = "The following are multiple choice questions (with answers)"
        header += f" about {subject.replace('_', ' ')}.\n\n" if subject else ".\n\n"
        prompt = header + "".join(shots.get(subject, [])) + _mmlu_block(question, choices)
        items.append(ChoiceItem(contexts=[prompt] * len(choices),
                                continuations=[f" {LETTERS[i]}" for i in range(len(choices))],
                                answer=answer, id=str(rec.get("id", where)), group=subject))
    return items


# ----------------------------------------------------------------------------------- WinoGrande
def winogrande_items(path_or_spec: str, limit: int | None = None) -> list[ChoiceItem]:
    """WinoGrande items with partial scoring.

    For option ``c``, ``contexts[c]`` is the sentence up to the blank ``_`` with the option
    filled in, and the shared continuation is ``" " + rest.strip()`` (the text after the blank),
    as in lm-evaluation-harness. Reads ``sentence, option1, option2, answer`` with answer
    ``"1"``/``"2"`` (shared/data and ``hf:allenai/winogrande:winogrande_xl:validation``).
    """
    items: list[ChoiceItem] = []
    for where, rec in _limited(iter_records(path_or_spec), limit):
        sentence = str(_field(rec, ["sentence"], path_or_spec, where, "WinoGrande"))
        options = [str(_field(rec, [k], path_or_spec, where, "WinoGrande")) for k in ("option1", "option2")]
        blank = sentence.find("_")
        if blank < 0:
            raise _fail(path_or_spec, where, "sentence has no blank '_'", "mark the blank with '_'")
        raw = str(_field(rec, ["answer", "label"], path_or_spec, where, "WinoGrande")).strip()
        if raw not in ("1", "2"):
            raise _fail(path_or_spec, where, f"answer {raw!r} is not '1' or '2' (unlabelled test split?)",
                        "use a labelled split such as validation")
        continuation = " " + sentence[blank + 1:].strip()
        items.append(ChoiceItem(contexts=[sentence[:blank] + o for o in options],
                                continuations=[continuation, continuation], answer=int(raw) - 1,
                                id=str(rec.get("qID", where))))
    return items


# ----------------------------------------------------------------------------------- BoolQ
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def _boolq_label(rec: dict[str, Any], spec: str, where: str) -> int:
    raw = _field(rec, ["answer", "label"], spec, where, "BoolQ")
    text = str(raw).strip().lower()
    if isinstance(raw, bool) or text in _TRUE | _FALSE:
        return int(raw) if isinstance(raw, bool) else int(text in _TRUE)
    raise _fail(spec, where, f"label {raw!r} is not true/false", "use a labelled split such as validation")


def boolq_items(path_or_spec: str, limit: int | None = None) -> list[ChoiceItem]:
    """BoolQ items: ``prompt = "{passage}\\nQuestion: {question}?\\nAnswer:"``, choices
    ``[" no", " yes"]``.

    Reads the SuperGLUE layout (``label`` "true"/"false" or 0/1) and ``hf:google/boolq``
    (``answer`` bool). A trailing ``?`` is not doubled.
    """
    items: list[ChoiceItem] = []
    for where, rec in _limited(iter_records(path_or_spec), limit):
        passage = str(_field(rec, ["passage"], path_or_spec, where, "BoolQ")).strip()
        question = str(_field(rec, ["question"], path_or_spec, where, "BoolQ")).strip().rstrip("?")
        prompt = f"{passage}\nQuestion: {question}?\nAnswer:"
        items.append(ChoiceItem(contexts=[prompt, prompt], continuations=[" no", " yes"],
                                answer=_boolq_label(rec, path_or_spec, where),
                                id=str(rec.get("idx", where))))
    return items


# ----------------------------------------------------------------------------------- GSM8K
def gsm8k_items(path_or_spec: str, limit: int | None = None) -> list[AnswerItem]:
    """GSM8K question/answer pairs (``question``, ``answer`` fields; shared/data and
    ``hf:openai/gsm8k:main:test``) for answer-only NLL scoring."""
    items: list[AnswerItem] = []
    for where, rec in _limited(iter_records(path_or_spec), limit):
        question = str(_field(rec, ["question"], path_or_spec, where, "GSM8K")).strip()
        answer = str(_field(rec, ["answer"], path_or_spec, where, "GSM8K")).strip()
        items.append(AnswerItem(question=question, answer=answer, id=str(rec.get("id", where))))
    return items


# ----------------------------------------------------------------------------------- the table
def default_dev(data: str) -> str | None:
    """``mmlu_dev.jsonl`` next to an ``mmlu_test.jsonl`` file, if present."""
    from pathlib import Path

    path = Path(data)
    dev = path.with_name(path.name.replace("test", "dev"))
    return str(dev) if "test" in path.name and dev != path and dev.is_file() else None


def _texts(data: str, options) -> tuple[list, dict]:
    from .data import load_texts

    texts = load_texts(data, text_field=options.text_field, limit=options.limit)
    return texts.texts, {"sha256": texts.sha256, "text_field": options.text_field}


def _mmlu(data: str, options) -> tuple[list, dict]:
    dev = options.dev if options.dev is not None else default_dev(data)
    k_shot = options.k_shot if dev else 0
    return (mmlu_items(data, dev=dev, k_shot=k_shot, limit=options.limit),
            {"dev": dev, "k_shot": k_shot})


def _plain(loader):
    return lambda data, options: (loader(data, limit=options.limit), {})


# task name (attngeom/common/tasks.py) -> loader(data, options) -> (units, what to record);
# options: anything with limit, text_field, dev and k_shot (a FaithConfig)
LOADERS = {"lm": _texts, "gsm8k-answer": _plain(gsm8k_items), "mmlu": _mmlu,
           "winogrande": _plain(winogrande_items), "boolq": _plain(boolq_items)}


def load(task: str, data: str, options) -> tuple[list, dict]:
    """The texts or items of ``task`` in ``data`` and what to record about them (a text set's
    sha256 and field; MMLU's exemplar file and shots). No torch."""
    from attngeom.common import tasks

    tasks.get(task)                                 # a one-line error for an unknown task
    return LOADERS[task](data, options)
