"""kill -9 at several moments, then the same command again: the result equals an uninterrupted run.

``attngeom extract`` and ``attngeom faithfulness`` run as subprocesses on a tiny saved llama and
are killed with SIGKILL (1) while a file is being written (a temporary file exists) and (2) mid-way
through the run; the second kill hits the resumed run. The same command then finishes (in this
process, to save a torch import). Every dataset and attribute of every written netCDF file, read
with h5py, must equal those of an uninterrupted run bit for bit, the manifest must be equal apart
from timestamps and each file's sha256 (checked against its own file: compressed bytes are not
promised to repeat), and no temporary file may remain.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from reliability.conftest import N_WORDS
from reliability.rel_helpers import (assert_bitwise_equal, cli_main, cli_start, manifest,
                                      netcdf_contents, readme, temporaries)

EXTRACT = ("--mode", "compact", "--sink-k", "1", "--tail-w", "3", "--max-length", "10",
           "--shard-size", "2", "--batch-size", "2", "--quiet")
FAITH = ("--metrics", "attention,contribution", "--ranks", "signed", "--fractions", "0.2,0.5",
         "--limit", "8", "--block-size", "2", "--batch-size", "2", "--max-length", "10",
         "--quiet")


def kill_when(runs: list[tuple[subprocess.Popen, object]], timeout: float = 180.0) -> list[bool]:
    """SIGKILL each process as soon as its ``ready()`` holds; False for one that ended first.

    The processes run concurrently (the machine's cores are shared by both).
    """
    killed: dict[int, bool] = {}
    deadline = time.monotonic() + timeout
    while len(killed) < len(runs) and time.monotonic() < deadline:
        for i, (proc, ready) in enumerate(runs):
            if i in killed:
                continue
            if ready():
                proc.send_signal(signal.SIGKILL)
                killed[i] = True
            elif proc.poll() is not None:
                killed[i] = False
        time.sleep(0.001)
    ended = []
    for i, (proc, _) in enumerate(runs):
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
        if not killed.get(i, True):
            ended.append(f"rc {proc.returncode}: {err.strip()[-300:]}")
    assert len(killed) == len(runs), f"nothing happened within {timeout} s"
    assert not ended, f"a run ended before it was killed: {ended}"
    return [killed[i] for i in range(len(runs))]


@pytest.fixture(scope="module")
def killed(tiny_model, texts, rel_dir) -> dict[str, Path]:
    """Stores of extract and faithfulness runs killed twice each (both chains concurrently).

    Kill 1: extract while a shard's temporary file exists, faithfulness at its first finished
    block. Kill 2 (the resumed runs): extract after 6 of 12 shards, faithfulness after 3 of 4
    blocks.
    """
    out = {"extract": rel_dir / "killed-extract", "faithfulness": rel_dir / "killed-faith"}
    shards, partial = out["extract"] / "shards", out["faithfulness"] / "faithfulness.partial"
    commands = {"extract": ("extract", "--model", tiny_model, "--data", texts, *EXTRACT),
                "faithfulness": ("faithfulness", "--model", tiny_model, "--data", texts, *FAITH)}
    first = {"extract": lambda: shards.is_dir() and any(".tmp-" in p.name
                                                        for p in shards.iterdir()),
             "faithfulness": lambda: partial.is_dir() and any(partial.glob("block-*.nc"))}
    second = {"extract": lambda: len(list(shards.glob("shard-*.nc"))) >= 6,
              "faithfulness": lambda: len(list(partial.glob("block-*.nc"))) >= 3}
    for when in (first, second):
        runs = [(cli_start(*commands[k], "--out", out[k]), when[k]) for k in commands]
        assert kill_when(runs) == [True, True], "a run ended before it was killed"
    return out


def test_extract_killed_twice_resumes_to_the_same_store(killed, tiny_model, texts, rel_dir):
    command = ("extract", "--model", tiny_model, "--data", texts, *EXTRACT)
    out, clean = killed["extract"], rel_dir / "clean-extract"
    shards = out / "shards"
    done = json.loads((out / "manifest.json").read_text())
    assert not done["complete"] and 3 <= len(done["shards"]) < 12

    rc, _, err = cli_main(*command, "--out", out)       # the same command finishes
    assert rc == 0, err
    rc, _, err = cli_main(*command, "--out", clean)     # the uninterrupted run
    assert rc == 0, err

    assert temporaries(out) == []
    names = sorted(p.name for p in shards.glob("*"))
    assert names == sorted(p.name for p in (clean / "shards").glob("*")) and len(names) == 12
    for name in names:
        assert_bitwise_equal(netcdf_contents(shards / name),
                             netcdf_contents(clean / "shards" / name), name)
    got = manifest(out)
    assert got == manifest(clean)
    assert got["complete"] and got["counts"]["skipped_empty"] == 1 and got["n_sequences"] == 24
    assert got["counts"]["truncated"] == sum(n + 1 > 10 for n in N_WORDS)      # + BOS
    assert readme(out) == readme(clean)


def test_faithfulness_killed_twice_resumes_to_the_same_result(killed, tiny_model, texts,
                                                              rel_dir):
    command = ("faithfulness", "--model", tiny_model, "--data", texts, *FAITH)
    out, clean = killed["faithfulness"], rel_dir / "clean-faith"
    partial = out / "faithfulness.partial"
    assert not (out / "faithfulness.nc").exists() and 3 <= len(list(partial.glob("block-*")))

    rc, stdout, err = cli_main(*command, "--out", out)
    assert rc == 0, err
    assert "resuming an interrupted run" in stdout
    rc, _, err = cli_main(*command, "--out", clean)
    assert rc == 0, err

    assert temporaries(out) == [] and not partial.exists()
    assert_bitwise_equal(netcdf_contents(out / "faithfulness.nc", skip_attrs={"created"}),
                         netcdf_contents(clean / "faithfulness.nc", skip_attrs={"created"}),
                         "faithfulness.nc")
    assert manifest(out) == manifest(clean)
