"""Every bad input: exit status 2, exactly one line on stderr naming the problem, no traceback.

Commands run in this process through ``attngeom.cli.main`` (argparse errors included); one
subprocess checks that errors found in the arguments, the model spec and the data come before
torch is imported, and that ``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from attngeom.store.format.manifest import file_sha256
from reliability.rel_helpers import ENV, ROOT, cli_main


@pytest.fixture(scope="module")
def bad(rel_dir, tiny_model, small_store) -> dict[str, Path]:
    """Bad files, model folders and stores, keyed by name."""
    base = rel_dir / "bad"
    base.mkdir(exist_ok=True)
    files = {
        "latin1.txt": "caf\xe9 au lait\n".encode("latin-1"),
        "latin1.jsonl": b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
        "notjson.jsonl": b'{"text": "the a"}\n{"text": "the"\n',
        "nofield.jsonl": b'{"text": "the a"}\n{"body": "of to"}\n',
        "array.jsonl": b'{"text": "the a"}\n["the"]\n',
        "blank.jsonl": b'{"text": "  "}\n{"text": ""}\n{"text": "\\n\\t"}\n',
        "texts.csv": b"text\nthe a\n",
        "ok.jsonl": b'{"text": "the a of"}\n{"text": "to and in"}\n',
        "notafolder": b"x",
    }
    out = {}
    for name, data in files.items():
        (base / name).write_bytes(data)
        out[name] = base / name
    (base / "noconfig").mkdir(exist_ok=True)
    out["noconfig"] = base / "noconfig"
    broken = Path(shutil.copytree(tiny_model, base / "brokenconfig", dirs_exist_ok=True))
    (broken / "config.json").write_text('{"model_type": ')
    out["brokenconfig"] = broken
    import tiny_archs

    out["bloom"] = tiny_archs.save("bloom", base / "bloom")   # attention outside the interface
    out.update(bad_stores(base, small_store))
    return out


def _edit(store: Path, change) -> Path:
    manifest = json.loads((store / "manifest.json").read_text())
    change(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))
    return store


def bad_stores(base: Path, good: Path) -> dict[str, Path]:
    def copy(name: str) -> Path:
        return Path(shutil.copytree(good, base / name, dirs_exist_ok=True))

    stores = {"empty dir": base / "emptydir"}
    stores["empty dir"].mkdir(exist_ok=True)
    stores["schema 99"] = _edit(copy("schema99"), lambda m: m.update(schema_version=99))
    stores["no sequences"] = _edit(copy("nosequences"),
                                   lambda m: m.update(shards=[], n_sequences=0))
    stores["incomplete"] = _edit(copy("incomplete"), lambda m: m.update(complete=False))
    missing = copy("missingshard")
    (missing / "shards" / "shard-00001.nc").unlink()
    stores["missing shard"] = missing
    damaged = copy("damagedshard")
    path = damaged / "shards" / "shard-00001.nc"
    path.write_bytes(path.read_bytes()[:3000])
    stores["damaged shard"] = damaged
    other = copy("othershard")                     # a shard made with other options
    manifest = json.loads((other / "manifest.json").read_text())
    with h5py.File(other / "shards" / "shard-00001.nc", "r+") as f:
        f.attrs["attngeom_config_hash"] = "0" * 64
    manifest["shards"][1]["sha256"] = file_sha256(other / "shards" / "shard-00001.nc")
    (other / "manifest.json").write_text(json.dumps(manifest))
    stores["other shard"] = other
    stores["more sequences"] = _edit(copy("moresequences"),
                                     lambda m: m.update(n_sequences=10 ** 12))
    stores["fewer sequences"] = _edit(copy("fewersequences"), lambda m: m.update(n_sequences=3))
    return stores


def E(bad, tiny, texts, out, *extra):                  # noqa: N802 - a command line
    return ("extract", "--model", tiny, "--data", texts, "--out", out, *extra)


def F(bad, tiny, texts, out, *extra):                  # noqa: N802 - a command line
    return ("faithfulness", "--model", tiny, "--data", texts, "--out", out, *extra)


# name -> (argument builder, words the one line must contain)
CASES = {
    "bad mode": (lambda b, m, t, o: E(b, m, t, o, "--mode", "sparse"),
                 ["attngeom extract: error:", "--mode", "sparse", "--help"]),
    "not an int": (lambda b, m, t, o: E(b, m, t, o, "--max-length", "ten"),
                   ["--max-length", "invalid int value"]),
    "missing option": (lambda b, m, t, o: ("extract", "--model", m), ["required", "--data"]),
    "unknown command": (lambda b, m, t, o: ("extrakt",), ["invalid choice", "extrakt"]),
    "max-length 0": (lambda b, m, t, o: E(b, m, t, o, "--max-length", "0"),
                     ["--max-length", "at least 1"]),
    "batch-size -1": (lambda b, m, t, o: E(b, m, t, o, "--batch-size", "-1"),
                      ["--batch-size", "at least 1"]),
    "unknown model": (lambda b, m, t, o: E(b, "no-such-model", t, o),
                      ["unknown model spec", "no-such-model"]),
    "model without config": (lambda b, m, t, o: E(b, b["noconfig"], t, o),
                             ["no config.json"]),
    "model config not JSON": (lambda b, m, t, o: E(b, b["brokenconfig"], t, o),
                              ["config.json", "not valid JSON"]),
    "unsupported architecture": (lambda b, m, t, o: E(b, b["bloom"], t, o),
                                 ["'bloom' computes attention without transformers' attention "
                                  "interface"]),
    "missing data": (lambda b, m, t, o: E(b, m, Path(t).with_name("missing.jsonl"), o),
                     ["not found"]),
    "unknown data extension": (lambda b, m, t, o: E(b, m, b["texts.csv"], o),
                               ["unknown text spec", ".csv"]),
    "non-UTF-8 txt": (lambda b, m, t, o: E(b, m, b["latin1.txt"], o),
                      ["not UTF-8", "offset 3", "re-encode"]),
    "non-UTF-8 jsonl": (lambda b, m, t, o: E(b, m, b["latin1.jsonl"], o),
                        ["not UTF-8", "line 2"]),
    "JSONL line not JSON": (lambda b, m, t, o: E(b, m, b["notjson.jsonl"], o),
                            ["line 2", "not valid JSON"]),
    "JSONL line lacks the field": (lambda b, m, t, o: E(b, m, b["nofield.jsonl"], o,
                                                        "--text-field", "text"),
                                   ["line 2", "no field 'text'", "--text-field"]),
    "JSONL line not an object": (lambda b, m, t, o: E(b, m, b["array.jsonl"], o),
                                 ["line 2", "not an object"]),
    "only blank texts": (lambda b, m, t, o: E(b, m, b["blank.jsonl"], o),
                         ["no non-empty text", "3 empty skipped"]),
    "unknown dtype": (lambda b, m, t, o: E(b, m, t, o, "--dtype", "int8"),
                      ["--dtype 'int8'", "float32"]),
    "float16 on the CPU": (lambda b, m, t, o: E(b, m, t, o, "--dtype", "float16"),
                           ["float16", "CPU"]),
    "unknown device": (lambda b, m, t, o: E(b, m, t, o, "--device", "tpu0"),
                       ["--device 'tpu0'"]),
    "out is a file": (lambda b, m, t, o: E(b, m, t, b["notafolder"]), ["is a file"]),
    "bad --part": (lambda b, m, t, o: E(b, m, t, o, "--part", "4/4"), ["--part 4/4"]),
    "bad --shard (the earlier name of --part)": (
        lambda b, m, t, o: E(b, m, t, o, "--shard", "4/4"), ["--part 4/4"]),
    "sink window as long as the texts": (
        lambda b, m, t, o: E(b, m, t, o, "--sink-k", "64", "--max-length", "32"),
        ["--sink-k 64", "not shorter than --max-length 32", "--sink-k below 32"]),
    "faithfulness: sink window as long as the texts": (
        lambda b, m, t, o: F(b, m, t, o, "--sink-k", "32", "--max-length", "32"),
        ["--sink-k 32", "not shorter than --max-length 32", "--sink-k below 32"]),
    "run: texts of one token leave no key but the sink": (
        lambda b, m, t, o: ("run", "--model", m, "--data", t, "--out", o, "--max-length", "1"),
        ["--sink-k 1", "not shorter than --max-length 1", "larger --max-length"]),
    "fraction above 1": (lambda b, m, t, o: F(b, m, t, o, "--fractions", "0.1,1.5"),
                         ["--fractions", "[0, 1]"]),
    "fraction below 0": (lambda b, m, t, o: F(b, m, t, o, "--fractions=-0.1"),
                         ["--fractions", "[0, 1]"]),
    "fraction not a number": (lambda b, m, t, o: F(b, m, t, o, "--fractions", "a,b"),
                              ["--fractions", "numbers"]),
    "drift fraction 0": (lambda b, m, t, o: F(b, m, t, o, "--drift-low-fraction", "0"),
                         ["--drift-low-fraction", "(0, 1]"]),
    "unknown task": (lambda b, m, t, o: F(b, m, t, o, "--task", "squad"),
                     ["--task", "invalid choice"]),
    "unknown metric": (lambda b, m, t, o: F(b, m, t, o, "--metrics", "attention,saliency"),
                       ["--metrics", "attention,saliency"]),
    "faithfulness: value zeroing out of reach": (
        lambda b, m, t, o: F(b, m, t, o, "--metrics", "value_zeroing", "--granularity", "token",
                             "--max-hours", "1e-9"),
        ["value zeroing would take at least", "hours here", "--limit", "--max-length",
         "--layers", "--max-hours 1e-09"]),
    "analyze: not a store": (lambda b, m, t, o: ("analyze", b["empty dir"], "--out", o),
                             ["no manifest.json"]),
    "analyze: other schema version": (lambda b, m, t, o: ("analyze", b["schema 99"], "--out", o),
                                      ["schema version 99"]),
    "analyze: empty store": (lambda b, m, t, o: ("analyze", b["no sequences"], "--out", o),
                             ["no sequences"]),
    "analyze: incomplete store": (lambda b, m, t, o: ("analyze", b["incomplete"], "--out", o),
                                  ["incomplete", "resume"]),
    "analyze: missing shard": (lambda b, m, t, o: ("analyze", b["missing shard"], "--out", o),
                               ["shard-00001.nc", "missing"]),
    "analyze: damaged shard": (lambda b, m, t, o: ("analyze", b["damaged shard"], "--out", o),
                               ["cannot read shards", "validate"]),
    "analyze: shard of other options": (lambda b, m, t, o: ("analyze", b["other shard"],
                                                            "--out", o),
                                        ["shard-00001.nc", "config hash"]),
    **{f"{' '.join(command[:2 if command[0] == 'store' else 1])}: manifest counts {more} sequences than its shards": (
        lambda b, m, t, o, c=command, k=more: (*c[:-1], b[f"{k} sequences"], *c[-1:], o),
        ["disagrees with its shards", "store validate",
         "are in no shard" if more == "more" else "past the 3 the manifest records"])
       for more in ("more", "fewer")
       for command in [("analyze", "--out"), ("report", "--out"), ("view", "--out"),
                       ("compare", "--out"), ("store", "subset", "--out"),
                       ("store", "export", "--format", "zarr", "--out"),
                       ("store", "merge", "--out")]},
    "extract into a store of other options": (
        lambda b, m, t, o: ("extract", "--model", m, "--data", b["ok.jsonl"], "--out",
                            b["no sequences"]), ["other settings"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line(case, bad, tiny_model, texts, tmp_path):
    build, words = CASES[case]
    rc, out, err = cli_main(*build(bad, tiny_model, texts, tmp_path / "out"))
    lines = err.strip().splitlines()
    assert rc == 2, (case, rc, err)
    assert len(lines) == 1 and "Traceback" not in err, (case, err)
    assert lines[0].startswith("attngeom") and " error: " in lines[0], (case, err)
    assert "internal error" not in lines[0], (case, err)
    for word in words:
        assert word in lines[0], (case, word, lines[0])
    assert not (tmp_path / "out").exists(), (case, "an output was made for a bad input")


def test_cuda_without_a_gpu(tiny_model, texts, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    rc, _, err = cli_main(*E(None, tiny_model, texts, tmp_path / "o", "--device", "cuda"))
    assert rc == 2 and err.strip().splitlines() == [
        "attngeom: error: --device cuda: no CUDA GPU is available; use --device cpu"]


def test_errors_come_before_torch_and_debug_shows_traceback(bad, tiny_model, texts, tmp_path):
    """In a fresh interpreter: bad arguments, model specs and data fail without torch."""
    commands = [CASES[c][0](bad, tiny_model, texts, tmp_path / "o") for c in (
        "bad mode", "max-length 0", "unknown model", "non-UTF-8 txt", "JSONL line not JSON",
        "fraction above 1", "float16 on the CPU", "model config not JSON",
        "sink window as long as the texts")]
    script = ("import sys, json\nfrom attngeom.cli import main\ncodes = []\n"
              f"for argv in {json.dumps([[str(a) for a in c] for c in commands])}:\n"
              "    try:\n        codes.append(main(argv))\n"
              "    except SystemExit as exc:\n        codes.append(exc.code)\n"
              "print(json.dumps([codes, 'torch' in sys.modules]))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, text=True,
                         capture_output=True, timeout=120)
    codes, torch_loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert codes == [2] * len(commands) and not torch_loaded, run.stderr
    assert len(run.stderr.strip().splitlines()) == len(commands), run.stderr
    debug = subprocess.run([sys.executable, "-m", "attngeom", "--debug", *commands[2][:1],
                            *map(str, commands[2][1:])], cwd=ROOT, env=ENV, text=True,
                           capture_output=True, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
