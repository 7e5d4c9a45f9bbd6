"""Every long command stopped by SIGTERM or SIGINT, as ``kill PID`` or a batch scheduler does.

For each command two runs go side by side: SIGTERM sent to the main process alone and SIGINT
sent to its whole process group, each at the moment a file is first being written under the
command's output (:func:`reliability.signals.temporary_under`). Each must end within
:data:`reliability.signals.GRACE` seconds with status 143 or 130, its last line saying it was
interrupted, no process of it left; what it wrote must not read as complete; and the same
command rerun must finish and write what an uninterrupted run writes (every value and attribute bit
for bit, apart from timestamps; each file's sha256 checked against the file, not against the
other run's; the suite reruns the SIGTERM one). ``ATTNGEOM_SIGNAL_POINTS=all`` (the stand-ins
script, ``.ci/standins``) stops each command at two other points, as soon as it has started and
once the first output file is complete, and reruns both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from pypdf import PdfReader

from reliability.rel_helpers import (assert_bitwise_equal, cli_main, manifest, netcdf_contents,
                                     temporaries)
from reliability.signals import stop, temporary_under

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="watches the command's processes through /proc")

EXTRACT = ("--mode", "compact", "--sink-k", "1", "--tail-w", "3", "--max-length", "10",
           "--shard-size", "2", "--batch-size", "2", "--quiet")
FAITH = ("--metrics", "attention,contribution", "--ranks", "signed", "--fractions", "0.2,0.5",
         "--limit", "8", "--block-size", "2", "--batch-size", "2", "--max-length", "10",
         "--quiet")
RUN = ("--limit", "4", "--faith-limit", "2", "--max-length", "10", "--batch-size", "2",
       "--metrics", "attention,contribution", "--ranks", "signed", "--fractions", "0.5",
       "--bootstrap", "10", "--quiet")


@dataclass
class Command:
    """A command line writing under ``out``, the files that make its result, and how to tell
    that an interrupted run's files are not a result."""

    args: Callable[[Path], tuple]
    results: Callable[[Path], list[Path]]       # every file of a finished run, compared
    unfinished: Callable[[Path], bool]


def _store_files(store: Path) -> list[Path]:
    return [store / "manifest.json", *sorted((store / "shards").glob("*.nc"))]


def _not_complete(store: Path) -> bool:
    path = store / "manifest.json"
    return not path.exists() or not json.loads(path.read_text()).get("complete")


def _analysis_incomplete(folder: Path) -> bool:
    from attngeom.analysis.results import SUMMARY_FILE

    return not (folder / SUMMARY_FILE).exists()


def commands(model: Path, texts: Path, store: Path, dense: Path, export: Path
             ) -> dict[str, Command]:
    analysis = ("sinks", "convexity", "anti_alignment", "decomposition")
    return {
        "extract": Command(lambda o: ("extract", "--model", model, "--data", texts, *EXTRACT,
                                      "--out", o), _store_files, _not_complete),
        "faithfulness": Command(
            lambda o: ("faithfulness", "--model", model, "--data", texts, *FAITH, "--out", o),
            lambda o: [o / "faithfulness.nc", o / "manifest.json"],
            lambda o: not (o / "faithfulness.nc").exists()),
        "analyze": Command(
            lambda o: ("analyze", store, "--out", o, "--bootstrap", 20, "--no-progress"),
            lambda o: [o / f"{n}.nc" for n in analysis] + [o / "summary.csv"],
            _analysis_incomplete),
        "report": Command(
            lambda o: ("report", store, "--out", o / "report.pdf", "--analysis", o / "analysis",
                       "--bootstrap", 20, "--no-progress"),
            lambda o: [o / "report.pdf", o / "analysis" / "summary.csv"],
            lambda o: not (o / "report.pdf").exists()),
        "compare": Command(
            lambda o: ("compare", store, dense, "--out", o / "compare.pdf", "--csv", o),
            lambda o: [o / "compare.pdf", o / "summary.csv"],
            lambda o: not (o / "compare.pdf").exists()),
        "run": Command(
            lambda o: ("run", "--model", model, "--data", texts, *RUN, "--out", o),
            lambda o: [*_store_files(o / "store"), o / "store" / "faithfulness.nc"],
            lambda o: not (o / "report.pdf").exists() or _not_complete(o / "store")),
        "store merge": Command(
            lambda o: ("store", "merge", store, dense.parent / "other-small", "--out", o),
            _store_files, _not_complete),
        "store import": Command(lambda o: ("store", "import", export, "--out", o),
                                _store_files, _not_complete),
        "store export": Command(
            lambda o: ("store", "export", store, "--format", "hf", "--out", o),
            lambda o: [o / "manifest.source.json"],
            lambda o: (o / ".attngeom-export-incomplete").exists()
            or not (o / "manifest.source.json").exists()),
    }


def _started(out: Path) -> Callable[[], bool]:
    return lambda: True


def _first_file(out: Path) -> Callable[[], bool]:
    """A point: a first file under ``out`` is complete (no temporary name)."""
    return lambda: out.exists() and any(p.is_file() and not p.name.startswith(".")
                                        for p in out.rglob("*"))


# the suite stops each command while it writes; the stand-ins (ATTNGEOM_SIGNAL_POINTS=all) at
# two more points, each with both reruns
ALL_POINTS = os.environ.get("ATTNGEOM_SIGNAL_POINTS") == "all"
POINTS = ({"first file": _first_file, "at start": _started} if ALL_POINTS
          else {"writing": temporary_under})


@pytest.fixture(scope="module")
def setting(tiny_model, texts, small_store, small_dense_store, rel_dir) -> dict:
    """The commands, on the reliability fixtures, with what they read prepared."""
    base = rel_dir / "signals"
    other = small_dense_store.parent / "other-small"
    if not other.exists():                    # a second part for `store merge`
        shutil.copytree(small_store, other)
    export = base / "export"
    for store in (small_store, small_dense_store):
        if not (store / "analysis" / "summary.csv").exists():
            rc, _, err = cli_main("analyze", store, "--out", store / "analysis",
                                  "--bootstrap", 20, "--no-progress")
            assert rc == 0, err
    rc, _, err = cli_main("store", "export", small_store, "--format", "hf", "--out", export)
    assert rc == 0, err
    return {"base": base, "commands": commands(tiny_model, texts, small_store,
                                               small_dense_store, export), "clean": {}}


def _clean(setting: dict, name: str) -> Path:
    """The uninterrupted run of ``name`` (made once)."""
    if name not in setting["clean"]:
        out = setting["base"] / f"clean-{name.replace(' ', '-')}"
        rc, _, err = cli_main(*setting["commands"][name].args(out))
        assert rc == 0, err
        setting["clean"][name] = out
    return setting["clean"][name]


def _same(command: Command, got: Path, want: Path) -> None:
    for a, b in zip(command.results(got), command.results(want), strict=True):
        assert a.name == b.name and a.is_file(), a
        if a.suffix == ".nc":
            assert_bitwise_equal(netcdf_contents(a, skip_attrs={"created"}),
                                 netcdf_contents(b, skip_attrs={"created"}), str(a))
        elif a.name == "manifest.json":
            ma, mb = manifest(a.parent), manifest(b.parent)
            assert _without_paths(ma, got) == _without_paths(mb, want), a
        elif a.suffix == ".pdf":
            assert len(PdfReader(a).pages) == len(PdfReader(b).pages), a
        else:
            assert a.read_bytes() == b.read_bytes(), a


def _without_paths(obj, root: Path):
    """A manifest with the run's own output folder written as OUT (two runs, two folders)."""
    return json.loads(json.dumps(obj).replace(str(root), "OUT"))


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("name", ["extract", "faithfulness", "analyze", "report", "compare",
                                  "run", "store merge", "store import", "store export"])
def test_a_stopped_command_ends_leaves_no_result_and_reruns_to_the_same(setting, name, point):
    command = setting["commands"][name]
    runs = {(signal.SIGTERM, False): setting["base"] / f"{name}-{point}-term",
            (signal.SIGINT, True): setting["base"] / f"{name}-{point}-int-group"}
    with ThreadPoolExecutor(len(runs)) as pool:
        stopped = {key: pool.submit(stop, command.args(out), POINTS[point](out), *key)
                   for key, out in runs.items()}
        stopped = {key: future.result() for key, future in stopped.items()}
    for (signum, group), out in runs.items():
        where = f"{name}, {signal.Signals(signum).name} to the {'group' if group else 'process'}"
        stopped[signum, group].check(signum)
        assert command.unfinished(out), f"{where}: an interrupted run reads as finished"
        if group and not ALL_POINTS:            # the suite reruns one of the two
            continue
        rc, _, err = cli_main(*command.args(out))
        assert rc == 0, f"{where}: the rerun failed: {err}"
        assert temporaries(out) == [], where
        _same(command, out, _clean(setting, name))


LEAVES_A_CHILD = """
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import signal, time; "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"])
time.sleep(0.5)
open(sys.argv[1], "w").close()
time.sleep(30)
"""


def test_the_watch_catches_a_process_left_running(tmp_path):
    """The check is not vacuous: a program whose child outlives it is caught."""
    marker = tmp_path / ".x.tmp-1"
    got = stop((), marker.exists, signal.SIGTERM, group=False, grace=1.0,
               argv=[sys.executable, "-c", LEAVES_A_CHILD, str(marker)])
    assert len(got.left) == 1 and got.returncode == -signal.SIGTERM
    with pytest.raises(AssertionError, match="processes left running"):
        got.check(signal.SIGTERM)
