"""The faithfulness tasks: each one entry, the only place a task is described.

An entry (:class:`Task`) names the task, what its data holds (``texts`` to score by perplexity,
``answer`` pairs whose answer tokens are scored, multiple-``choice`` items scored by accuracy)
and its words. Torch-free: the option declarations (``--task``) read :func:`names`;
extract/loading/tasks.py reads each task's data through its table of loaders (``LOADERS``, by
name) and extract/faithfulness/scoring.py prepares it by ``data`` (``PREPARE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from .errors import Refusal

TEXTS, ANSWER, CHOICE = "texts", "answer", "choice"     # what a task's data holds


@dataclass(frozen=True)
class Task:
    """One faithfulness task (see the module docstring)."""

    name: str
    data: str                  # TEXTS, ANSWER or CHOICE
    words: str                 # "texts", "GSM8K question/answer pairs", ...: error messages

    @property
    def scored(self) -> str:
        """``lm`` (perplexity over scored tokens) or ``choice`` (accuracy over options)."""
        return "choice" if self.data == CHOICE else "lm"


TABLE: dict[str, Task] = {t.name: t for t in (
    Task("lm", TEXTS, "text"),
    Task("gsm8k-answer", ANSWER, "gsm8k-answer item"),
    Task("mmlu", CHOICE, "mmlu item"),
    Task("winogrande", CHOICE, "winogrande item"),
    Task("boolq", CHOICE, "boolq item"),
)}


def names() -> tuple[str, ...]:
    """The task names, language modelling first."""
    return tuple(TABLE)


def get(name: str) -> Task:
    """The entry of ``name``; a one-line ValueError naming the tasks otherwise."""
    try:
        return TABLE[name]
    except KeyError:
        raise Refusal(f"unknown task '{name}'; use one of {', '.join(TABLE)}") from None
