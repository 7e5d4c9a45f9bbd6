"""Disk full and read-only output folders: one line naming the path, nothing half-written.

As root (chmod does not stop root) the test mounts a tiny tmpfs: 96 KiB for a real full disk, or
read-only; as another user it uses chmod 555 and simulates ENOSPC by making writes fail. Atomic
writers leave no temporary file, and the rerun after space is freed finishes the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import pytest

from reliability.rel_helpers import cli_main

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
OPTIONS = ("--max-length", "8", "--shard-size", "2", "--batch-size", "2", "--quiet")


@contextlib.contextmanager
def mounted(path: Path, options: str):
    """A tmpfs at ``path`` (root only); skips the test when mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def small_data(tmp_path: Path) -> Path:
    from store_helpers import write_texts

    return write_texts(tmp_path / "texts.jsonl", (3, 9, 5, 1, 7, 4, 6, 2))


def test_disk_full(tiny_model, tmp_path, monkeypatch):
    data, place = small_data(tmp_path), tmp_path / "disk"
    with contextlib.ExitStack() as stack:
        if ROOT_USER:
            stack.enter_context(mounted(place, "size=96k"))
        else:                                   # simulate: the second shard's write fails
            real = os.fsync

            def full(fd):
                if "shard-00001" in os.readlink(f"/proc/self/fd/{fd}"):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real(fd)

            monkeypatch.setattr(os, "fsync", full)
        out = place / "store"
        rc, _, err = cli_main("extract", "--model", tiny_model, "--data", data, "--out", out,
                              *OPTIONS)
        line = one_line(err)
        assert rc == 2 and line.startswith(f"attngeom: error: cannot write {out}/"), line
        assert "No space left on device" in line and "free disk space" in line, line
        assert not [p for p in out.rglob(".*") if ".tmp-" in p.name]     # no temporary left
        finished = sorted(p.name for p in (out / "shards").glob("shard-*.nc"))
        from attngeom.store.format.manifest import read_manifest

        recorded = sorted(Path(e["file"]).name for e in read_manifest(out)["shards"])
        assert recorded == finished and len(finished) < 4        # the manifest tells the truth
        target = tmp_path / "roomy"
        if ROOT_USER:                            # the same store on a disk with room
            subprocess.run(["cp", "-a", str(out), str(target)], check=True)
        else:
            monkeypatch.undo()
            target = out
    rc, _, err = cli_main("extract", "--model", tiny_model, "--data", data, "--out", target,
                          *OPTIONS)
    assert rc == 0, err
    from attngeom.store.io.validate import validate

    assert validate(target) == []


def test_read_only_output(tiny_model, small_store, tmp_path):
    data, place = small_data(tmp_path), tmp_path / "ro"
    with contextlib.ExitStack() as stack:
        if ROOT_USER:
            stack.enter_context(mounted(place, "ro,size=64k"))
        else:
            place.mkdir()
            place.chmod(0o555)
            stack.callback(place.chmod, 0o755)
        out = place / "store"
        rc, _, err = cli_main("extract", "--model", tiny_model, "--data", data, "--out", out,
                              *OPTIONS)
        line = one_line(err)
        assert rc == 2 and f"--out {out}: {place} is not writable" in line, line


def test_read_only_existing_store(tiny_model, tmp_path):
    """Resuming a finished store on a read-only disk: the manifest write fails cleanly."""
    if not ROOT_USER:
        pytest.skip("needs root to remount a tmpfs read-only")
    data, place = small_data(tmp_path), tmp_path / "disk"
    with mounted(place, "size=2m"):
        out = place / "store"
        rc, _, err = cli_main("extract", "--model", tiny_model, "--data", data, "--out", out,
                              *OPTIONS)
        assert rc == 0, err
        subprocess.run(["mount", "-o", "remount,ro", str(place)], check=True)
        rc, _, err = cli_main("extract", "--model", tiny_model, "--data", data, "--out", out,
                              *OPTIONS)
        line = one_line(err)                    # the command line checks --out first
        assert rc == 2 and f"--out {out}: {out} is not writable" in line, line
        from attngeom.extract.run import ExtractConfig, extract
        from attngeom.store.errors import StoreWriteError

        with pytest.raises(StoreWriteError, match=f"cannot write {out}/manifest.json: "
                                                  "Read-only file system; .* writable --out"):
            extract(str(tiny_model), str(data), out, ExtractConfig(
                max_length=8, shard_size=2, batch_size=2), progress=False)


def test_atomic_writer_leaves_old_file_or_new(tmp_path, monkeypatch):
    """A failed fsync leaves the previous manifest intact and no temporary file."""
    from attngeom.store.errors import StoreError
    from attngeom.store.io.atomic import atomic_write_bytes

    path = tmp_path / "manifest.json"
    atomic_write_bytes(path, b"old")

    def fail(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(StoreError, match=f"cannot write {path}: No space left on device"):
        atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json"]
