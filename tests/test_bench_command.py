"""benchmarks/plain_script.py tokenizes as ``attngeom extract`` does, and
benchmarks/bench_command.py's round arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import tiny_models as tm
from store_helpers import write_texts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_command as bc  # noqa: E402
import plain_script as ps  # noqa: E402

from attngeom.extract.loading.data import (batches, load_texts, pad_token_id,  # noqa: E402
                                           tokenize_texts)
from attngeom.extract.loading.models import cache_dir  # noqa: E402


def _smollm2():
    from transformers import AutoTokenizer

    found = sorted((cache_dir() / "models").glob("SmolLM2-135M-Instruct*/tokenizer.json"))
    if not found:
        pytest.skip("no cached SmolLM2 tokenizer (make setup)")
    return AutoTokenizer.from_pretrained(found[0].parent)


def _no_pad():
    tok = tm.make_tokenizer("llama")
    tok.pad_token = None                           # attngeom pads with EOS then
    assert tok.pad_token_id is None
    return tok


TOKENIZERS = {"tiny-llama": lambda: tm.make_tokenizer("llama"),
              "tiny-bert": lambda: tm.make_tokenizer("bert"),     # [CLS] ... [SEP]: re-encoded
              "tiny-no-pad": _no_pad, "smollm2": _smollm2}


def _texts_file(path: Path) -> Path:
    words = tm._WORDS[:60]
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, n)) for n in (3, 40, 12, 0, 25, 7)]
    texts[3] = "  \n "                                       # skipped by both
    texts.insert(1, " = Robert Boulter = \n He had a guest @-@ starring role , café ")
    path.write_text("".join(json.dumps({"title": str(i), "text": t}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_plain_script_tokenizes_as_extract(name, tmp_path):
    """The same texts, ids, truncation, padding side and pad id as attngeom's own batches."""
    data = _texts_file(tmp_path / "texts.jsonl")
    cut = []
    for limit, max_length, size in ((None, 16, 2), (4, 9, 3), (2, 64, 1)):
        ref_tok, tok = TOKENIZERS[name](), TOKENIZERS[name]()
        texts = load_texts(str(data), limit=limit).texts
        assert ps.read_texts(str(data), limit) == texts
        want = list(batches(tokenize_texts(ref_tok, texts, max_length), size,
                            pad_id=pad_token_id(ref_tok)))
        got = ps.encode(tok, texts, max_length, size)
        assert len(got) == len(want)
        cut += tokenize_texts(ref_tok, texts, max_length).truncated
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g["input_ids"].numpy(), w["input_ids"])
            np.testing.assert_array_equal(g["attention_mask"].numpy(), w["attention_mask"])
    assert any(cut) and not all(cut)                  # texts cut and texts kept whole


def test_plain_script_ids_are_the_stores(tmp_path, capsys):
    """plain_script.py's printed hash is the hash of the token ids the command's store holds
    (the benchmark's check), and it differs when the texts do."""
    from attngeom.cli import main as cli_main

    model = tm.save_tiny("llama", tmp_path / "model")
    data = write_texts(tmp_path / "texts.jsonl", (3, 12, 6, 30))
    store = tmp_path / "store"
    assert cli_main(["extract", "--model", str(model), "--data", str(data), "--max-length",
                     "20", "--batch-size", "2", "--limit", "3", "--quiet",
                     "--out", str(store)]) == 0
    capsys.readouterr()
    printed = {}
    for attn in ("sdpa", "eager"):
        assert ps.main(["--model", str(model), "--data", str(data), "--max-length", "20",
                        "--batch-size", "2", "--limit", "3", "--attn", attn]) == 0
        printed[attn] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ids = bc.store_ids(store)
    assert [len(x) for x in ids] == [4, 13, 7]                  # BOS + words
    assert printed["sdpa"]["ids_sha256"] == printed["eager"]["ids_sha256"] == bc.ids_sha256(ids)
    assert printed["sdpa"]["tokens"] == 24
    assert bc.ids_sha256(ids[:2]) != bc.ids_sha256(ids)


def test_round_arithmetic():
    assert [bc.round_order(r) for r in range(3)] == [
        ["command", "sdpa", "eager"], ["sdpa", "eager", "command"],
        ["eager", "command", "sdpa"]]                 # each process in each place once
    rows = []
    for command, sdpa, eager in ((25.0, 20.0, 25.0), (30.0, 20.0, 24.0), (22.0, 20.0, 20.0)):
        got = {"command_s": command, "sdpa_s": sdpa, "eager_s": eager,
               "command_cpu_s": 2 * command, "sdpa_cpu_s": sdpa, "eager_cpu_s": eager,
               "eager_forward_s": eager / 2}
        got.update(bc.round_ratios(got))
        rows.append(got)
    assert rows[0]["ratio_command_to_sdpa_process"] == 1.25
    assert rows[1]["ratio_command_to_eager_process"] == 1.25
    assert rows[2]["ratio_command_to_sdpa_process_cpu"] == 2.2
    assert rows[0]["ratio_command_to_eager_forward"] == 2.0
    summary, spread = bc.summarize_rounds(rows)
    assert summary["ratio_command_to_sdpa_process"] == 1.25            # of 1.25, 1.5, 1.1
    assert summary["ratio_command_to_eager_process"] == 1.1            # of 1.0, 1.25, 1.1
    assert summary["command_s"] == 25.0
    assert spread["ratio_command_to_sdpa_process"] == [1.1, 1.5]
    assert "command_s" not in spread


def test_plain_script_imports_no_attngeom():
    """The plain script is what a user writes without attngeom: torch, transformers and the
    standard library only."""
    import ast

    tree = ast.parse(Path(ps.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "argparse", "hashlib", "json", "time", "torch",
                     "transformers"}, names
