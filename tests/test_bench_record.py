"""``attngeom bench --record ID``: what a benchmark prints becomes a benchmark record.

A stand-in benchmarks/ folder (a script printing JSON lines as the real ones do, and the real
benchmarks/records.py) is run through the command; the record appended must hold the printed
numbers under their case and key, the date and the command, and nothing is appended when the
benchmark fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attngeom import cli
from attngeom.commands import bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = '''import json, sys
print("progress on stdout is not JSON")
print(json.dumps({"case": "packed", "bytes": 64.1, "ratio": {"float32": 0.529}, "ok": True}))
print(json.dumps({"section": "time", "wall_s": 3.5, "machine": {"cpus": 2}}))
if sys.argv[1:] == ["kill"]:
    import os, signal
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
'''


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "bench_store.py").write_text(SCRIPT)
    shutil.copy(ROOT / "benchmarks" / "records.py", tmp_path / "records.py")
    monkeypatch.setattr(bench, "benchmarks_dir", lambda: tmp_path)
    return tmp_path


def test_record_holds_what_the_benchmark_printed(folder, capsys):
    assert cli.main(["bench", "--record", "store-try", "store"]) == 0
    assert "progress on stdout" in capsys.readouterr().out          # passed through
    lines = (folder / "records.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["id"] == "store-try" and rec["command"] == "attngeom bench store"
    assert rec["values"] == {"packed__bytes": 64.1, "packed__ratio__float32": 0.529,
                             "time__wall_s": 3.5}
    assert rec["machine"] == {"cpus": 2} and len(rec["date"]) == 10


def test_a_failed_benchmark_is_not_recorded(folder):
    assert cli.main(["bench", "--record", "store-try", "store", "1"]) == 1
    assert not (folder / "records.jsonl").exists()


def test_a_benchmark_killed_by_a_signal_is_not_recorded(folder):
    """A child killed by SIGTERM returns -15 to Python; the command must not read it as 0."""
    assert cli.main(["bench", "--record", "store-try", "store", "kill"]) == 128 + 15
    assert not (folder / "records.jsonl").exists()


def test_without_record_nothing_is_written(folder):
    assert cli.main(["bench", "store"]) == 0
    assert not (folder / "records.jsonl").exists()
