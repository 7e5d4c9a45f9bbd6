"""Stop a command with a signal, as ``kill PID`` or a batch scheduler does, and watch it end.

:func:`stop` starts ``attngeom ARGS`` (through ``held_writes.py``, so that a write is seen
while it lasts) in a session of its own, waits until a *point* of the run is reached (a
predicate polled every millisecond), sends SIGTERM or SIGINT to the main process alone or to
its whole process group, and returns what happened: the exit status,
the last line of stderr and every process the command had started that is still alive
:data:`GRACE` seconds after the signal. Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reliability.rel_helpers import ENV, ROOT

HELD_WRITES = Path(__file__).with_name("held_writes.py")   # attngeom, each write held a moment
GRACE = 10.0                # seconds within which no process of the command may be left
EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}


def children(pid: int) -> set[int]:
    """The children of every thread of process ``pid`` (empty once it is gone)."""
    found: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            found |= {int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text()
                      .split()}
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def descendants(pid: int) -> set[int]:
    seen: set[int] = set()
    todo = [pid]
    while todo:
        new = children(todo.pop()) - seen
        seen |= new
        todo.extend(new)
    return seen


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to read its status is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@dataclass
class Stopped:
    returncode: int
    last_line: str            # of stderr
    left: list[int]           # processes of the command alive GRACE s after the signal
    seconds: float            # from the signal to the main process's exit

    def check(self, signum: int) -> None:
        """The command ended as a stopped command must: no process left; status 143 or 130
        with its one line, or (a signal before Python has started attngeom, when the default
        action ends it) killed by the signal itself, which a shell reports as 143 or 130."""
        assert self.left == [], f"processes left running: {self.left}"
        assert self.returncode in (EXIT[signum], -signum), (self.returncode, self.last_line)
        if self.returncode == EXIT[signum]:
            assert self.last_line.startswith("attngeom: interrupted"), self.last_line


def temporary_under(folder: Path) -> Callable[[], bool]:
    """A point: a file is being written under ``folder`` (its temporary name exists)."""
    return lambda: folder.exists() and any(".tmp-" in p.name for p in folder.rglob(".*"))


def stop(args, point: Callable[[], bool], signum: int, group: bool,
         timeout: float = 180.0, grace: float = GRACE, argv: list[str] | None = None
         ) -> Stopped:
    """Run ``attngeom ARGS`` (or ``argv``), signal it at ``point``; raise when it ends before
    the point."""
    err = tempfile.TemporaryFile("w+")
    argv = argv or [sys.executable, str(HELD_WRITES), *map(str, args)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=err,
                            text=True, start_new_session=True)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while not point():
            if proc.poll() is not None or time.monotonic() > deadline:
                err.seek(0)
                raise AssertionError(f"the command ended (rc {proc.returncode}) or timed out "
                                     f"before the point: {err.read()[-500:]}")
            seen |= descendants(proc.pid)
            time.sleep(0.001)
        seen |= descendants(proc.pid)
        (os.killpg if group else os.kill)(proc.pid, signum)
        sent = time.monotonic()
        while proc.poll() is None and time.monotonic() < sent + grace:
            seen |= descendants(proc.pid)
            time.sleep(0.01)
        took = time.monotonic() - sent
        while any(alive(p) for p in seen) and time.monotonic() < sent + grace:
            time.sleep(0.01)
        left = sorted(p for p in seen | {proc.pid} if alive(p))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in seen:                    # a process the command left: not this test's
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    err.seek(0)
    lines = err.read().strip().splitlines()
    return Stopped(proc.returncode, lines[-1] if lines else "", left, took)
