"""``python tests/reliability/held_writes.py ARGS``: ``attngeom ARGS`` with each atomic write
held a moment under its temporary name before the rename.

:func:`signals.stop` runs commands this way so that its "writing" point (a ``.NAME.tmp-PID``
exists) is seen however fast the machine writes: ``store merge`` hard-links small shards in
microseconds, faster than a poll. Only the timing changes: the write, its fsync and its rename
are :func:`attngeom.common.atomic.atomic_file`'s own, and a signal during the hold ends the
command as one during the write does (the temporary file removed, the rename not done).

SIGINT gets Python's own handler back first: a process started from a shell's background job
(``cmd &`` without job control, as ``nohup`` scripts run the suite) inherits SIGINT ignored, and
Python then keeps ignoring it (POSIX). The tests stand for a command in the foreground, where
Ctrl-C or a scheduler's SIGINT reaches it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time

HOLD = 0.05                 # seconds each temporary file stays before its rename


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from attngeom.common import atomic

    write = atomic.atomic_file

    @contextlib.contextmanager
    def held(path, fsync: bool = True):
        with write(path, fsync) as tmp:
            yield tmp
            time.sleep(HOLD)

    atomic.atomic_file = held             # before any module imports it by name
    from attngeom.cli import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
