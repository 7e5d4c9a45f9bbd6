"""extract/heap.py's release: the free pages inside the C heap go back to the system, once the
resident set has grown by the given bytes and RELEASE_TOKENS tokens were measured since the last
time. In a fresh process, with the C
library's own malloc: 40 MB of 100 kB blocks (heap blocks, below the mmap threshold) written,
all but the last freed (the heap cannot shrink past it)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, json
from attngeom.extract import heap

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
MB = 1 << 20
first = heap.release(grown=8 * MB)                # the first call trims
blocks = [libc.malloc(100_000) for _ in range(400)]
for b in blocks:
    ctypes.memset(b, 1, 100_000)                  # resident
for b in blocks[:-1]:
    libc.free(b)
held = heap.resident_bytes()
small = heap.release(tokens=0, grown=1 << 40)     # grown by less: nothing
few = heap.release(tokens=heap.RELEASE_TOKENS - 1, grown=8 * MB)   # grown, too few tokens
kept = heap.resident_bytes()
done = heap.release(tokens=1, grown=8 * MB)       # the tokens add up
print(json.dumps({"first": first, "small": small, "few": few, "done": done,
                  "kept": (held - kept) / MB, "freed": (kept - heap.resident_bytes()) / MB}))
"""


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc_trim only")
def test_release_gives_back_the_heap_s_free_pages():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first"] is True and got["small"] is False and got["few"] is False
    assert got["done"] is True
    assert abs(got["kept"]) < 1                   # not trimmed below the growth asked for
    assert got["freed"] > 30                      # 40 MB freed in the heap, pages given back


def test_release_without_the_c_library_does_nothing(monkeypatch):
    from attngeom.extract import heap

    monkeypatch.setattr(heap, "_TRIM", None)
    assert heap.release(grown=0) is False


BOUND_CHILD = r"""
import ctypes, json, sys
from attngeom.extract import heap

class Info(ctypes.Structure):                     # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks "
                                              "fsmblks uordblks fordblks keepcost").split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
MB = 1 << 20
set_ = heap.bound(16 * MB) if sys.argv[1] == "bound" else None
libc.free(libc.malloc(24 * MB))                  # glibc's own threshold rises to 24 MB
before = libc.mallinfo2().hblkhd
block = libc.malloc(20 * MB)
print(json.dumps({"set": set_, "mapped": (libc.mallinfo2().hblkhd - before) / MB}))
"""


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt and mallinfo2 only")
@pytest.mark.parametrize("mode", ["bound", "default"])
def test_bound_maps_large_blocks_by_themselves(mode):
    """After a 24 MB block is freed glibc serves a 20 MB one from the heap, where it may stay
    when freed; with bound(16 MB) it is mapped by itself (counted in mallinfo2's hblkhd)."""
    # glibc's malloc settings from the environment (dask.distributed's nanny sets
    # MALLOC_TRIM_THRESHOLD_ in this process for its workers) fix its threshold: not here
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", BOUND_CHILD, mode], capture_output=True,
                         text=True, check=True, env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if mode == "bound":
        assert got["set"] is True and got["mapped"] >= 20
    else:
        assert got["mapped"] == 0
