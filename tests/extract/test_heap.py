"""extract/heap.py's release: the free pages inside the C heap go back to the system, once the
resident set has grown by the given bytes since the last time. In a fresh process, with the C
library's own malloc: 40 MB of 100 kB blocks (heap blocks, below the mmap threshold) written,
all but the last freed (the heap cannot shrink past it)."""

from __future__ import annotations

import ctypes
import json
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
small = heap.release(grown=1 << 40)               # grown by less: nothing
kept = heap.resident_bytes()
done = heap.release(grown=8 * MB)
print(json.dumps({"first": first, "small": small, "done": done,
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
    assert got["first"] is True and got["small"] is False and got["done"] is True
    assert abs(got["kept"]) < 1                   # not trimmed below the growth asked for
    assert got["freed"] > 30                      # 40 MB freed in the heap, pages given back


def test_release_without_the_c_library_does_nothing(monkeypatch):
    from attngeom.extract import heap

    monkeypatch.setattr(heap, "_TRIM", None)
    assert heap.release(grown=0) is False
