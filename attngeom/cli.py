"""The ``attngeom`` command line: one entry point, one module per subcommand.

Each module in :mod:`attngeom.commands` defines ``add_parser(subparsers)`` and ``run(args)``;
modules are imported lazily so that ``analyze`` and ``report`` never import torch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import signal
import sys

from attngeom.common.errors import Refusal
from attngeom.common.interrupts import Terminated, terminate_unwinds

# subcommand -> (module under attngeom.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "extract": ("extract", "measure attention geometry of a model over texts into a store"),
    "faithfulness": ("faithfulness", "remove keys ranked by each metric and measure the loss"),
    "analyze": ("analyze", "sink, convexity, anti-alignment and decomposition statistics"),
    "report": ("report", "build the PDF report of a store"),
    "compare": ("compare", "several stores side by side: one table, per-layer figures"),
    "run": ("main_job", "the main job: extract, faithfulness, analyze and report"),
    "view": ("view", "explore a store in a browser: one self-contained HTML file"),
    "store": ("store", "inspect, validate, merge, subset, export and import stores"),
    "bench": ("bench", "benchmarks: speed and memory side by side"),
    "models": ("models", "the built-in models: list them, install the larger ones"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line usage error: ``PROG: error: MESSAGE (see PROG --help)``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


MAX_MESSAGE = 600
# HDF5 read errors of a damaged chunk (Fletcher-32 or gzip failure) met while computing
DAMAGED = ("filter returned failure", "Can't synchronously read data", "checksum")
# errors that describe the user's input or machine (one line, exit status 2): refusals raised on
# purpose, and what the system reports (a file it cannot read or write, memory it lacks)
USER_ERRORS: tuple[type[BaseException], ...] = (Refusal, OSError, MemoryError)
USER_EXIT = 2
# anything else is a bug in attngeom: its own exit status (sysexits' EX_SOFTWARE) and a report
INTERNAL_EXIT = 70
REPORT_TO = ("please report it with the output of the same command run with --debug "
             "(the attngeom repository's issue tracker; CONTRIBUTING.md says how)")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="attngeom",
        description="contribution weights for self-attention: measure a transformer, store, "
                    "analyse and report (attngeom COMMAND --help for each command)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(f"attngeom.commands.{module}")   # broken: an error
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_parser(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``attngeom ARGV``; the exit status: 0, 2 (a refusal), 70 (a bug), 130 or 143
    (stopped by SIGINT or SIGTERM, which unwind from the first line on)."""
    try:
        with terminate_unwinds():
            return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt as exc:
        signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        hook, sys.unraisablehook = sys.unraisablehook, _unraised
    try:              # the interrupt's frames are released here, after the except block
        close_progress_bars()
        gc.collect()
    finally:
        sys.unraisablehook = hook
    print("attngeom: interrupted; rerun the same command to resume", file=sys.stderr)
    # 128 + the signal's number, as a shell reports a process the signal ended
    return 128 + signum


def _unraised(_) -> None:
    """Errors of objects the interrupt left half-built (an h5netcdf File stopped inside its
    ``__init__`` fails in ``__del__``), finalised as the interrupt's frames go: not printed,
    so that the one line saying what happened stays the last."""


def _main(argv: list[str]) -> int:
    debug = "--debug" in argv                    # accepted anywhere on the line
    argv = [a for a in argv if a != "--debug"]
    try:
        parser = build_parser(argv)
    except Exception as exc:  # a command that cannot even be built is a bug
        reraise_interrupt(exc)
        if debug:
            raise
        print(error_line(exc), file=sys.stderr)
        return INTERNAL_EXIT
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except Exception as exc:  # one line for users, the traceback with --debug
        reraise_interrupt(exc)
        if debug:
            raise
        close_progress_bars()
        print(error_line(exc), file=sys.stderr)
        return USER_EXIT if isinstance(exc, USER_ERRORS) else INTERNAL_EXIT


def reraise_interrupt(exc: BaseException) -> None:
    """Raise the SIGINT or SIGTERM that ``exc`` wraps, if any: an interrupt that arrives while
    Python runs ``__set_name__`` (a dataclass defined as a module imports, e.g. formulaic's
    under ``analyze``) comes out as a RuntimeError caused by it, which is no bug."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def close_progress_bars() -> None:
    """Close every live tqdm bar (a bar left open ends its line), so that the message printed
    next starts a line of its own instead of continuing the bar's."""
    tqdm = sys.modules.get("tqdm")                  # no bar was drawn unless tqdm was imported
    if tqdm is None:
        return
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        try:
            bar.close()
        except (OSError, ValueError):               # its stream is gone: nothing to end
            continue
    sys.stdout.flush()


def error_line(exc: BaseException) -> str:
    """One stderr line for an exception: the first line of its message, or its type."""
    text = " ".join(str(exc).split()) if str(exc).strip() else type(exc).__name__
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
    if isinstance(exc, OSError) and any(m in text for m in DAMAGED):
        return (f"attngeom: error: a store file is damaged ({text}); run `attngeom store "
                "validate STORE` to find it, then re-extract or restore that shard")
    if isinstance(exc, USER_ERRORS):
        return f"attngeom: error: {text}"
    return (f"attngeom: internal error (a bug in attngeom, not in your input): "
            f"{type(exc).__name__}: {text}; {REPORT_TO}")


if __name__ == "__main__":
    sys.exit(main())
