"""How a command stops on SIGINT or SIGTERM: the interrupt unwinds the main thread from
wherever it is, and one that something swallowed is raised again before any result appears.

An exception raised by a signal handler can be lost on its way out. Python prints one raised
inside a ``__del__`` or weakref callback as ignored and goes on; C code that clears every error
drops it without a word (numpy does, for whatever reading an object's ``.dtype`` raises, which
pandas meets while it writes a CSV). The command would then finish and exit 0, its results
complete, as if it had never been stopped. So the interrupt a signal asked for is remembered
until the command has stopped, and raised again: right after a finaliser (:class:`_Again`),
before any file is renamed into place (:func:`raise_if_stopped`, which
:func:`attngeom.common.atomic.atomic_file` calls) and at the end of :func:`terminate_unwinds`.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a batch scheduler's stop) raised in the main thread, so that the
    command unwinds as on Ctrl-C: temporary files are removed and worker processes stopped."""


class _Asked:
    """The interrupt a signal asked for within :func:`terminate_unwinds` (None: none)."""

    kind: type[KeyboardInterrupt] | None = None


def _stop(signum: int, frame) -> None:
    kind = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    _Asked.kind = kind
    if _again.hooking:                   # inside our own unraisable hook: raising would be lost
        _again.later(kind)
        return
    if kind is Terminated:               # a second SIGTERM ends the process at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise kind


def raise_if_stopped() -> None:
    """Raise the interrupt a signal asked for, unless it is already unwinding the main thread
    (something swallowed it); in other threads, nothing."""
    kind = _Asked.kind
    if (kind is not None and threading.current_thread() is threading.main_thread()
            and not isinstance(sys.exc_info()[1], KeyboardInterrupt)):
        raise kind


class _Again:
    """An interrupt raised where Python cannot raise (a ``__del__`` or weakref callback run by
    the garbage collector: Python prints it as ignored and goes on) is raised again once the
    finaliser has returned: by the main thread's next check for signals, which a short-lived
    thread trips, or at the end of :func:`terminate_unwinds` if the block ends first."""

    DELAY = 0.02           # seconds: long enough for the finaliser in the main thread to return

    def __init__(self) -> None:
        self.pending: type[KeyboardInterrupt] | None = None
        self.hooking = False

    def hook(self, previous):
        def unraisable(record) -> None:
            if not isinstance(record.exc_value, KeyboardInterrupt):
                previous(record)
                return
            self.hooking = True
            try:
                self.later(type(record.exc_value))
            finally:
                self.hooking = False
        return unraisable

    def later(self, kind: type[KeyboardInterrupt]) -> None:
        self.pending = kind
        if kind is Terminated:           # the handler set SIG_DFL as it raised the first time
            signal.signal(signal.SIGTERM, _stop)
        signum = signal.SIGTERM if kind is Terminated else signal.SIGINT
        threading.Thread(target=self._trip, args=(kind, signum), daemon=True).start()

    def _trip(self, kind: type[KeyboardInterrupt], signum: int) -> None:
        time.sleep(self.DELAY)
        if self.pending is kind:         # not yet raised at the block's end
            _thread.interrupt_main(signum)


_again = _Again()


@contextlib.contextmanager
def terminate_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` and SIGINT KeyboardInterrupt in the
    main thread (elsewhere, and outside the block, the handlers are left as they were; so is an
    ignored SIGINT, as a background job has it), and an interrupt that was swallowed is raised
    again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Asked.kind = None
    previous = signal.signal(signal.SIGTERM, _stop)
    interrupt = signal.getsignal(signal.SIGINT)
    if interrupt is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop)
    hook, sys.unraisablehook = sys.unraisablehook, _again.hook(sys.unraisablehook)
    try:
        yield
        raise_if_stopped()
    finally:
        _again.pending = _Asked.kind = None
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, previous)
