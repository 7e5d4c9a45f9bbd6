"""The C heap of an extraction: memory freed by one layer given back to the system.

glibc's malloc serves a request below its *mmap threshold* from the heap, and raises that
threshold (up to 32 MiB) to the size of each large block freed. PyTorch asks for 64-byte
aligned memory (``posix_memalign``), so a freed heap block is a few bytes short of the next
request of the same size, and small blocks allocated in between keep freed ones from merging:
a forward pass over a long text leaves each layer's freed tensors in the heap, unused, and the
resident set grows by 10-15 MB a layer at 8,192 tokens on SmolLM2-135M (tensors of 19 MB), in
some runs and not in others (the threads' timing decides which blocks neighbour which): the
peak of the same extraction varied by 550 MB over seven runs, a plain SDPA forward's by 450.

:func:`release` gives the heap's free pages back (``malloc_trim``, which also returns the free
pages inside the heap, not only at its top) once the resident set has grown by
:data:`RELEASE_BYTES` since the last time; the extraction calls it after each layer it
streams. A fixed mmap threshold (``M_MMAP_THRESHOLD``) bounds the heap as well, but maps and
zeroes every large tensor afresh: 12-15 % slower at 8,192 tokens. Other C libraries: nothing
is done.
"""

from __future__ import annotations

import ctypes
import os

RELEASE_BYTES = 32 << 20        # growth of the resident set that makes release() trim
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_state = {"after": None}        # the resident set after the last trim (or lowest since)


def resident_bytes() -> int | None:
    """This process's resident set (Linux ``/proc/self/statm``), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):                 # not glibc (macOS, Windows, musl)
        return None
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


_TRIM = _trim()


def release(grown: int = RELEASE_BYTES) -> bool:
    """Give the C heap's free pages back to the system if the resident set has grown by
    ``grown`` bytes since the last trim (or this is the first call); True when it trimmed."""
    now = resident_bytes()
    if _TRIM is None or now is None:
        return False
    last = _state["after"]
    if last is not None and now < last + grown:
        _state["after"] = min(last, now)              # from the lowest point since
        return False
    _TRIM(0)
    _state["after"] = resident_bytes()
    return True
