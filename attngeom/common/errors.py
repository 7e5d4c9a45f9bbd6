"""The errors a user can meet: refusals, raised on purpose, one line naming the problem and
the fix. The command line prints a :class:`Refusal` as ``attngeom: error: ...`` (exit status
2); any other exception is a bug in attngeom, reported as an internal error
(:mod:`attngeom.cli`). ``docs/refusals.py`` lists every refusal the code raises."""

from __future__ import annotations

from pathlib import Path


class Refusal(ValueError):
    """A request attngeom refuses on purpose: the message names the problem and the fix. A
    ValueError, so that code catching ValueError (as for any bad value) still does."""


class StoreError(Refusal):
    """A store that cannot be used as asked: the message names the problem and the fix."""


class StoreWriteError(StoreError):
    """Writing into a store failed (disk full, read-only folder, ...): names the path."""


def write_error(path: str | Path, exc: BaseException) -> StoreWriteError:
    """A one-line error naming ``path``, the system's reason and the fix."""
    errno_ = getattr(exc, "errno", None)
    reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0] or type(exc).__name__
    fix = {28: "free disk space or choose another --out",
           30: "the folder is on a read-only file system; choose a writable --out",
           13: "choose a writable --out or fix the folder's permissions",
           122: "the disk quota is exceeded; free space or choose another --out"}.get(
        errno_, "check the folder and choose a writable --out")
    return StoreWriteError(f"cannot write {path}: {reason}; {fix}")
