"""The C heap of an extraction: large blocks mapped by themselves, freed pages given back.

glibc's malloc serves a request below its *mmap threshold* from the heap, and raises that
threshold (up to 32 MiB) to the size of each large block freed. PyTorch asks for 64-byte
aligned memory (``posix_memalign``), so a freed heap block is a few bytes short of the next
request of the same size, and small blocks allocated in between keep freed ones from merging:
a forward pass over a long text leaves each layer's freed tensors in the heap, unused (the
threads' timing decides which blocks neighbour which), and the resident set's peak varies
from run to run by the memory so held, up to a quarter of a GB at 8,192 tokens on
SmolLM2-135M, whose per-layer head arrays are 19 MB each.

:func:`bound` fixes the threshold at :data:`MMAP_BYTES` (``M_MMAP_THRESHOLD``), so that
blocks of that size and more (only the per-layer arrays of long texts) are mapped when made
and returned when freed; each is then zeroed by the system afresh, which costs time in
proportion to them. :func:`release` gives the heap's free pages back (``malloc_trim``, which
also returns the free pages inside the heap, not only at its top) once the resident set has
grown by :data:`RELEASE_BYTES` and at least :data:`RELEASE_TOKENS` tokens were measured since
the last time; the extraction calls it after each layer it streams. A layer leaves about as
much in the heap at 512 tokens as at 8,192 (tens of MB), and the next layer, which reuses it,
faults every page given back in again: after every layer of a long text that is a small part
of the layer's time, after every layer of a batch of short ones a large part. Other C
libraries: nothing is done.
"""

from __future__ import annotations

import ctypes
import os

RELEASE_BYTES = 32 << 20        # growth of the resident set that makes release() trim
RELEASE_TOKENS = 8192           # and tokens measured since (sequences x positions, each layer)
MMAP_BYTES = 16 << 20           # blocks this large or larger are mapped by themselves
M_MMAP_THRESHOLD = -3           # mallopt's parameter number (glibc malloc.h)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_state = {"after": None, "tokens": 0}   # the resident set after the last trim (or lowest
                                        # since); tokens measured since


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


def bound(threshold: int = MMAP_BYTES) -> bool:
    """Have blocks of ``threshold`` bytes and more mapped by themselves, and unmapped when
    freed, for the rest of the process (glibc ``mallopt``); True where that was set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):                 # not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1


def release(tokens: int = RELEASE_TOKENS, grown: int = RELEASE_BYTES) -> bool:
    """Give the C heap's free pages back to the system if the resident set has grown by
    ``grown`` bytes and at least :data:`RELEASE_TOKENS` tokens were measured since the last
    trim, counting ``tokens`` (those of the layer just measured: sequences x positions), or
    this is the first call; True when it trimmed."""
    now = resident_bytes()
    if _TRIM is None or now is None:
        return False
    last, _state["tokens"] = _state["after"], _state["tokens"] + tokens
    if last is not None and (now < last + grown or _state["tokens"] < RELEASE_TOKENS):
        _state["after"] = min(last, now)              # from the lowest point since
        return False
    _TRIM(0)
    _state["after"], _state["tokens"] = resident_bytes(), 0
    return True
