"""Text specs, tokenization and batching (attngeom.extract.loading.data)."""
from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from attngeom.extract.loading import data
from attngeom.extract.loading.data import batches, load_texts, pad_token_id, tokenize_texts

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def one_line_error(excinfo: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# ----------------------------------------------------------------------------------- specs
def test_jsonl_default_field_text_and_skips(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"id": "x", "text": "hello world"}, {"text": "   \n"},
                                           {"text": ""}, {"text": "second"}])
    ts = load_texts(str(p))
    assert ts.texts == ["hello world", "second"]
    assert ts.skipped_empty == 2
    assert ts.spec == str(p)
    expected = hashlib.sha256(b'["hello world", "second"]').hexdigest()
    assert ts.sha256 == expected


def test_jsonl_first_string_field_and_explicit_field(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"n": 1, "body": "b1", "title": "t1"},
                                           {"n": 2, "body": "b2", "title": "t2"}])
    assert load_texts(str(p)).texts == ["b1", "b2"]
    assert load_texts(str(p), text_field="title").texts == ["t1", "t2"]


def test_jsonl_gsm8k_layout_joins_question_and_answer(tmp_path):
    p = write_jsonl(tmp_path / "g.jsonl", [{"question": "What is 1+1?", "answer": "It is 2.\n#### 2"}])
    assert load_texts(str(p)).texts == ["Question: What is 1+1?\nAnswer: It is 2.\n#### 2"]


def test_limit_counts_non_empty_texts(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in ["a", " ", "b", "c", "d"]])
    ts = load_texts(str(p), limit=2)
    assert ts.texts == ["a", "b"] and ts.skipped_empty == 1
    assert load_texts(str(p), limit=0).texts == []


def test_parquet(tmp_path):
    import pandas as pd
    p = tmp_path / "t.parquet"
    pd.DataFrame({"id": [1, 2, 3], "content": ["one", "", "three"]}).to_parquet(p)
    ts = load_texts(str(p))
    assert ts.texts == ["one", "three"] and ts.skipped_empty == 1
    with pytest.raises(ValueError) as e:
        load_texts(str(p), text_field="missing")
    one_line_error(e, "row 1", "'missing'", "content")


def test_txt_paragraphs_and_lines(tmp_path):
    p = tmp_path / "para.txt"
    p.write_text("First para\nstill first.\n\n\n  Second para.  \n \nThird.\n", encoding="utf-8")
    assert load_texts(str(p)).texts == ["First para\nstill first.", "Second para.", "Third."]
    q = tmp_path / "lines.txt"
    q.write_text("line one\nline two\nline three", encoding="utf-8")
    assert load_texts(str(q)).texts == ["line one", "line two", "line three"]


class FakeDataset(list):
    column_names = ["question", "answer"]


def test_hf_spec_through_datasets(monkeypatch):
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return FakeDataset([{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    ts = load_texts("hf:openai/gsm8k:main:test[:2]")
    assert calls == [("openai/gsm8k", "main", "test[:2]")]
    assert ts.texts == ["Question: q1\nAnswer: a1", "Question: q2\nAnswer: a2"]
    assert load_texts("hf:some/set:validation", text_field="answer").texts == ["a1", "a2"]
    assert calls[-1] == ("some/set", None, "validation")


def test_hf_load_failure_is_one_line(monkeypatch):
    def load_dataset(*a, **k):
        raise ConnectionError("Couldn't reach the hub\nmore detail")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ValueError) as e:
        load_texts("hf:nope/nope:train")
    one_line_error(e, "hf:nope/nope:train", "Couldn't reach the hub")


def test_hf_without_datasets_says_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)   # makes `import datasets` fail
    with pytest.raises(ValueError) as e:
        load_texts("hf:openai/gsm8k:main:test")
    one_line_error(e, "pip install datasets")


@pytest.mark.parametrize("spec", ["hf:gsm8k", "hf:", "hf:a:b:c:d", "hf:name:split extra"])
def test_malformed_hf_spec(spec):
    with pytest.raises(ValueError) as e:
        load_texts(spec)
    one_line_error(e, "malformed hf spec", "hf:NAME[:CONFIG]:SPLIT")


# ----------------------------------------------------------------------------------- errors
def test_missing_file(tmp_path):
    with pytest.raises(ValueError) as e:
        load_texts(str(tmp_path / "nope.jsonl"))
    one_line_error(e, "not found", "nope.jsonl")
    with pytest.raises(ValueError) as e:
        load_texts(str(tmp_path / "nope.txt"))
    one_line_error(e, "not found")


def test_non_utf8_jsonl_names_offset_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    good = b'{"text": "ok"}\n'
    p.write_bytes(good + b'{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "not UTF-8", f"offset {len(good) + 13}", "line 2")


def test_non_utf8_txt_names_offset_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine\nalso fine\nbad \xff here\n")
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "not UTF-8", "offset 19", "line 3")


def test_jsonl_line_not_json(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"text": "a"}\n\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "line 3", "not valid JSON")
    p.write_text('{"text": "a"}\n["text"]\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "line 2", "not an object")


def test_record_lacking_field(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}, {"body": "b", "id": 3}])
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "line 2", "'text'", "body, id", "text_field")


def test_field_not_a_string(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}, {"text": 5}])
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "line 2", "int")


def test_no_string_field(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"a": 1, "b": [2]}])
    with pytest.raises(ValueError) as e:
        load_texts(str(p))
    one_line_error(e, "line 1", "no string field", "a, b")


@pytest.mark.parametrize("name", ["data.csv", "data", "data.json"])
def test_unknown_extension(tmp_path, name):
    (tmp_path / name).write_text("x", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_texts(str(tmp_path / name))
    one_line_error(e, "unknown text spec", ".jsonl", "builtin")


# ----------------------------------------------------------------------------------- builtin
def test_builtin_corpus():
    a = load_texts("builtin")
    b = load_texts("builtin")
    assert len(a.texts) >= 100
    assert a.texts == b.texts and a.sha256 == b.sha256
    assert a.skipped_empty == 0
    for text in a.texts:
        assert len(text.split()) >= 200
        assert text == text.strip() and ">>>" not in text and "::=" not in text
        assert "****" not in text and "+---" not in text
    paragraphs = [p for text in a.texts for p in text.split("\n\n")]
    assert len(set(paragraphs)) == len(paragraphs)                # overlapping topics deduplicated
    assert load_texts("builtin", limit=5).texts == a.texts[:5]


# ----------------------------------------------------------------------------------- shared data
@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data not present")
@pytest.mark.parametrize("name,first_words", [
    ("gsm8k_test.jsonl", "Question: Janet"),
    ("wikitext2_raw_test.jsonl", " = Robert Boulter ="),
    ("openstax_psychology2e.jsonl", "Clive Wearing"),
])
def test_shared_files(name, first_words):
    ts = load_texts(str(SHARED / name), limit=10)
    assert len(ts.texts) == 10 and ts.texts[0].startswith(first_words)


# ----------------------------------------------------------------------------------- tokens
VOCAB = {"<unk>": 0, "<pad>": 1, "<s>": 2, "the": 3, "cat": 4, "sat": 5, "on": 6, "mat": 7}


def make_tokenizer(bos: bool):
    import tokenizers
    import transformers
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    kwargs = {"unk_token": "<unk>", "pad_token": "<pad>"}
    if bos:
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", VOCAB["<s>"])])
        kwargs["bos_token"] = "<s>"
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def test_tokenize_adds_bos_and_truncates():
    tok = make_tokenizer(bos=True)
    out = tokenize_texts(tok, ["the cat sat on the mat", "the cat", "dog"], max_length=4)
    assert out.ids == [[2, 3, 4, 5], [2, 3, 4], [2, 0]]
    assert out.truncated == [True, False, False]


def test_tokenize_without_bos_and_exact_length():
    tok = make_tokenizer(bos=False)
    out = tokenize_texts(tok, ["the cat sat", "the cat sat on"], max_length=3)
    assert out.ids == [[3, 4, 5], [3, 4, 5]]
    assert out.truncated == [False, True]
    with pytest.raises(ValueError) as e:
        tokenize_texts(tok, ["the"], max_length=0)
    one_line_error(e, "max_length")


def test_pad_token_id():
    assert pad_token_id(make_tokenizer(bos=True)) == 1
    assert pad_token_id(types.SimpleNamespace(pad_token_id=None, eos_token_id=9)) == 9
    assert pad_token_id(object()) == 0


def test_batches_right_padded_to_batch_longest():
    tk = data.Tokenized(ids=[[2, 3], [2, 3, 4, 5], [2], [2, 7, 7]], truncated=[False] * 4)
    out = list(batches(tk, batch_size=3, pad_id=-1))
    assert len(out) == 2
    b0, b1 = out
    np.testing.assert_array_equal(b0["input_ids"], [[2, 3, -1, -1], [2, 3, 4, 5], [2, -1, -1, -1]])
    np.testing.assert_array_equal(b0["attention_mask"], [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    np.testing.assert_array_equal(b0["index"], [0, 1, 2])
    np.testing.assert_array_equal(b1["input_ids"], [[2, 7, 7]])        # padded to its own longest
    np.testing.assert_array_equal(b1["index"], [3])
    for b in out:
        assert b["input_ids"].dtype == np.int64 and b["attention_mask"].dtype == np.int64
        assert (b["attention_mask"][:, 0] == 1).all()                 # position 0 is a real token
    again = list(batches(tk, batch_size=3, pad_id=-1))
    assert all((x["input_ids"] == y["input_ids"]).all() for x, y in zip(out, again))


def test_batches_sorted_by_length_maps_back():
    tk = data.Tokenized(ids=[[1], [1, 2, 3], [1, 2], [4, 5, 6]], truncated=[False] * 4)
    out = list(batches(tk, batch_size=2, sort_by_length=True))
    assert [b["index"].tolist() for b in out] == [[1, 3], [2, 0]]
    for b in out:
        for row, i in enumerate(b["index"]):
            n = int(b["attention_mask"][row].sum())
            assert b["input_ids"][row, :n].tolist() == tk.ids[i]
    with pytest.raises(ValueError):
        next(batches(tk, batch_size=0))


def test_end_to_end_builtin_to_batches():
    tok = make_tokenizer(bos=True)
    ts = load_texts("builtin", limit=4)
    tk = tokenize_texts(tok, ts.texts, max_length=64)
    assert all(ids[0] == 2 for ids in tk.ids) and all(tk.truncated)
    (b,) = list(batches(tk, batch_size=4, pad_id=pad_token_id(tok)))
    assert b["input_ids"].shape == (4, 64) and b["attention_mask"].all()


def _tokenizer_with(template: str | None, side: str = "right"):
    import tokenizers
    import transformers
    vocab = {**VOCAB, "</s>": 8}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    if template:
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single=template, special_tokens=[("<s>", 2), ("</s>", 8)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
        eos_token="</s>", truncation_side=side)


@pytest.mark.parametrize("template,side", [("<s> $A", "right"), (None, "right"),
                                           ("<s> $A </s>", "right"), ("$A </s>", "right"),
                                           ("<s> $A", "left")])
def test_tokenize_cuts_as_the_tokenizer_truncates(template, side):
    """Cut ids are the tokenizer's own ``truncation=True`` ids, whatever its special tokens
    and truncation side (slicing is used only where it gives the same)."""
    tok = _tokenizer_with(template, side)
    texts = ["the cat sat on the mat the cat", "the cat", "sat on the mat", "dog dog dog"]
    for n in (2, 3, 4, 5, 20):
        want = tok(texts, truncation=True, max_length=n)["input_ids"]
        out = tokenize_texts(tok, texts, max_length=n)
        assert out.ids == [list(x) for x in want]
        full = tok(texts)["input_ids"]
        assert out.truncated == [len(x) > n for x in full]
