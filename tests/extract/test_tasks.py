"""Evaluation task loaders (attngeom.extract.loading.tasks)."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from attngeom.extract.loading.tasks import (AnswerItem, ChoiceItem, boolq_items, gsm8k_items,
                                            mmlu_items, winogrande_items)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data not present")


def write_jsonl(path: Path, records: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def one_line_error(excinfo: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg


# ----------------------------------------------------------------------------------- ChoiceItem
def test_choice_item_validates_and_aliases():
    item = ChoiceItem(["p", "p"], [" no", " yes"], 1)
    assert item.prompt == "p" and item.choices == [" no", " yes"]
    with pytest.raises(AttributeError):
        _ = item.continuation
    with pytest.raises(ValueError):
        ChoiceItem(["p", "p"], [" a", " b"], 2)
    with pytest.raises(ValueError):
        ChoiceItem(["p"], [" a"], 0)
    with pytest.raises(ValueError):
        ChoiceItem(["p", "q"], [" a"], 0)


# ----------------------------------------------------------------------------------- MMLU
def mmlu_rec(subject, q, choices, answer, hf=False):
    if hf:
        return {"question": q, "subject": subject, "choices": choices, "answer": answer}
    return {"subject": subject, "question": q, **{f"choice{i}": c for i, c in enumerate(choices)},
            "answer": answer}


@pytest.mark.parametrize("hf", [False, True])
def test_mmlu_k_shot_prompt(tmp_path, hf):
    dev = write_jsonl(tmp_path / "dev.jsonl", [
        mmlu_rec("astronomy", "Sun is a?", ["star", "planet", "moon", "comet"], 0, hf),
        mmlu_rec("law", "Law Q?", ["w", "x", "y", "z"], 3, hf),
        mmlu_rec("astronomy", "Moon orbits?", ["Mars", "Earth", "Sun", "Venus"], 1, hf),
        mmlu_rec("astronomy", "Third?", ["1", "2", "3", "4"], 2, hf),
    ])
    test = write_jsonl(tmp_path / "test.jsonl", [
        mmlu_rec("astronomy", "  Largest planet? ", ["Jupiter", "Earth", "Mars", "Venus"], 0, hf),
        mmlu_rec("law", "Q2?", ["a", "b", "c", "d"], 2, hf),
    ])
    items = mmlu_items(test, dev=dev, k_shot=2)
    assert len(items) == 2
    expected = ("The following are multiple choice questions (with answers) about astronomy.\n\n"
                "Sun is a?\nA. star\nB. planet\nC. moon\nD. comet\nAnswer: A\n\n"
                "Moon orbits?\nA. Mars\nB. Earth\nC. Sun\nD. Venus\nAnswer: B\n\n"
                "Largest planet?\nA. Jupiter\nB. Earth\nC. Mars\nD. Venus\nAnswer:")
    assert items[0].prompt == expected
    assert items[0].choices == [" A", " B", " C", " D"] and items[0].answer == 0
    assert items[0].group == "astronomy"
    assert items[1].prompt.startswith("The following are multiple choice questions (with answers) about law."
                                      "\n\nLaw Q?\nA. w\nB. x\nC. y\nD. z\nAnswer: D\n\nQ2?")
    assert items[1].answer == 2
    zero = mmlu_items(test, k_shot=5)
    assert zero[1].prompt == ("The following are multiple choice questions (with answers) about law.\n\n"
                              "Q2?\nA. a\nB. b\nC. c\nD. d\nAnswer:")
    assert [i.group for i in mmlu_items(test, dev=dev, subjects=["law"])] == ["law"]
    assert len(mmlu_items(test, limit=1)) == 1


def test_mmlu_letter_answer_and_errors(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mmlu_rec("s", "q", ["a", "b", "c", "d"], "C")])
    assert mmlu_items(p)[0].answer == 2
    bad = write_jsonl(tmp_path / "b.jsonl", [mmlu_rec("s", "q", ["a", "b", "c", "d"], 7)])
    with pytest.raises(ValueError) as e:
        mmlu_items(bad)
    one_line_error(e, "line 1", "answer 7")
    nochoice = write_jsonl(tmp_path / "n.jsonl", [{"question": "q", "answer": 0}])
    with pytest.raises(ValueError) as e:
        mmlu_items(nochoice)
    one_line_error(e, "line 1", "no choices")


def test_mmlu_from_parquet(tmp_path):
    import pandas as pd
    p = tmp_path / "m.parquet"
    pd.DataFrame([mmlu_rec("s", "q?", ["a", "b", "c", "d"], 3)]).to_parquet(p)
    (item,) = mmlu_items(str(p))
    assert item.answer == 3 and item.prompt.endswith("q?\nA. a\nB. b\nC. c\nD. d\nAnswer:")


# ----------------------------------------------------------------------------------- WinoGrande
def test_winogrande_partial_scoring(tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [
        {"qID": "q1", "sentence": "The trophy didn't fit in the suitcase because _ was too big.",
         "option1": "the trophy", "option2": "the suitcase", "answer": "1"},
        {"sentence": "Ann gave Sue a gift so _ thanked her.", "option1": "Ann", "option2": "Sue",
         "answer": "2"},
    ])
    a, b = winogrande_items(p)
    assert a.contexts == ["The trophy didn't fit in the suitcase because the trophy",
                          "The trophy didn't fit in the suitcase because the suitcase"]
    assert a.continuation == " was too big." and a.answer == 0 and a.id == "q1"
    assert b.contexts == ["Ann gave Sue a gift so Ann", "Ann gave Sue a gift so Sue"]
    assert b.continuations == [" thanked her.", " thanked her."] and b.answer == 1
    assert b.id == "line 2"


def test_winogrande_errors(tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [{"sentence": "x _ y", "option1": "a", "option2": "b",
                                            "answer": ""}])
    with pytest.raises(ValueError) as e:
        winogrande_items(p)
    one_line_error(e, "line 1", "unlabelled")
    p = write_jsonl(tmp_path / "w2.jsonl", [{"sentence": "no blank", "option1": "a", "option2": "b",
                                             "answer": "1"}])
    with pytest.raises(ValueError) as e:
        winogrande_items(p)
    one_line_error(e, "line 1", "blank")
    p = write_jsonl(tmp_path / "w3.jsonl", [{"sentence": "x _ y", "option1": "a", "answer": "1"}])
    with pytest.raises(ValueError) as e:
        winogrande_items(p)
    one_line_error(e, "line 1", "'option2'", "sentence, option1, answer")


# ----------------------------------------------------------------------------------- BoolQ
@pytest.mark.parametrize("field,true,false", [("label", "true", "false"), ("answer", True, False),
                                               ("label", 1, 0)])
def test_boolq_layouts(tmp_path, field, true, false):
    p = write_jsonl(tmp_path / "b.jsonl", [
        {"question": "is the sky blue", "passage": "Sky -- The sky is blue.", field: true},
        {"question": "is grass red?", "passage": "Grass is green.", field: false},
    ])
    a, b = boolq_items(p)
    assert a.prompt == "Sky -- The sky is blue.\nQuestion: is the sky blue?\nAnswer:"
    assert b.prompt == "Grass is green.\nQuestion: is grass red?\nAnswer:"
    assert a.choices == [" no", " yes"] and (a.answer, b.answer) == (1, 0)


def test_boolq_bad_label(tmp_path):
    p = write_jsonl(tmp_path / "b.jsonl", [{"question": "q", "passage": "p", "label": "maybe"}])
    with pytest.raises(ValueError) as e:
        boolq_items(p)
    one_line_error(e, "line 1", "maybe")


# ----------------------------------------------------------------------------------- GSM8K
def test_gsm8k_items(tmp_path):
    p = write_jsonl(tmp_path / "g.jsonl", [{"question": "How many? ", "answer": "Two and 1,000.\n#### 1,002"}])
    (item,) = gsm8k_items(p)
    assert isinstance(item, AnswerItem)
    assert item.context == "Question: How many?\nAnswer:"
    assert item.continuation == " Two and 1,000.\n#### 1,002"
    assert item.final_answer == "1002"
    with pytest.raises(ValueError) as e:
        gsm8k_items(write_jsonl(tmp_path / "x.jsonl", [{"question": "q"}]))
    one_line_error(e, "line 1", "'answer'")


def test_hf_spec_reaches_loaders(monkeypatch):
    rows = {"google/boolq": [{"question": "q", "passage": "p", "answer": True}],
            "allenai/winogrande": [{"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "2"}]}
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(
        load_dataset=lambda name, config=None, split=None: list(rows[name])))
    assert boolq_items("hf:google/boolq:validation")[0].answer == 1
    assert winogrande_items("hf:allenai/winogrande:winogrande_xl:validation")[0].contexts == ["a x", "a y"]


# ----------------------------------------------------------------------------------- real files
@needs_shared
def test_shared_mmlu():
    items = mmlu_items(str(SHARED / "mmlu_test.jsonl"), dev=str(SHARED / "mmlu_dev.jsonl"), k_shot=5)
    assert len(items) == 2280 and len({i.group for i in items}) == 57
    first = items[0]
    assert first.prompt.count("\nAnswer: ") == 5 and first.prompt.endswith("\nD. 6\nAnswer:")
    assert "about abstract algebra." in first.prompt and first.answer == 1
    assert {i.answer for i in items} == {0, 1, 2, 3}


@needs_shared
def test_shared_winogrande_boolq_gsm8k():
    wino = winogrande_items(str(SHARED / "winogrande_dev.jsonl"))
    assert len(wino) == 760
    assert wino[0].contexts[1] == "Sarah was a much better surgeon than Maria so Maria"
    assert wino[0].continuation == " always got the easier cases." and wino[0].answer == 1
    boolq = boolq_items(str(SHARED / "boolq_validation.jsonl"))
    assert len(boolq) == 2000 and {b.answer for b in boolq} == {0, 1}
    assert all(b.prompt.endswith("?\nAnswer:") and "??" not in b.prompt[-12:] for b in boolq)
    gsm = gsm8k_items(str(SHARED / "gsm8k_test.jsonl"), limit=50)
    assert len(gsm) == 50 and gsm[0].final_answer == "18"
    assert all(g.final_answer is not None for g in gsm)


def test_every_task_of_the_table_has_a_loader_and_a_preparation():
    from attngeom.common import tasks
    from attngeom.common.vocab import TASKS
    from attngeom.extract.faithfulness.scoring import PREPARE
    from attngeom.extract.loading.tasks import LOADERS

    assert TASKS == tasks.names() and set(LOADERS) == set(TASKS)
    assert {tasks.get(t).data for t in TASKS} == set(PREPARE)
    with pytest.raises(ValueError, match="unknown task 'nope'; use one of lm, "):
        tasks.get("nope")
