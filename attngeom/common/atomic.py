"""Atomic files: every file attngeom writes goes through a temporary name, fsync and rename.

Readers see the old file or the new one, never half of one; an interrupted write leaves only a
temporary ``.NAME.tmp-PID`` beside it (:func:`attngeom.store.io.writer.remove_temporaries`
deletes those on a rerun). A failed write raises :class:`attngeom.common.errors.StoreWriteError`
naming the path, the system's reason and the fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from .errors import write_error
from .interrupts import raise_if_stopped


def temporary_name(path: Path) -> Path:
    """The temporary file a write of ``path`` goes through (removed on a rerun)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_file(path: str | Path, fsync: bool = True) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to: when the block ends the file is fsynced
    and renamed to ``path``; when it raises, or a signal has asked the command to stop
    (:func:`attngeom.common.interrupts.raise_if_stopped`), removed."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        raise_if_stopped()                   # no file appears after a stop was asked
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(path, exc) from exc
    finally:
        if tmp.exists():                     # (unlink itself fails on a read-only disk)
            tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename, folder fsync)."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def copy_file(src: str | Path, dst: str | Path, link: bool = False) -> None:
    """Copy (or, with ``link``, hard-link where the filesystem allows) ``src`` to ``dst``
    atomically. A symbolic link is followed: ``dst`` is always a file of its own."""
    src = Path(src)
    with atomic_file(dst) as tmp:
        try:
            if not link:
                raise OSError
            os.link(src.resolve(), tmp)          # link() itself would link a symlink
        except OSError:
            shutil.copyfile(src, tmp)


def fsync_dir(path: str | Path) -> None:
    """fsync a folder, so that a rename in it survives a crash (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
