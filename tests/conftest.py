"""Shared test setup: make the helper modules in tests/ importable from every subfolder."""

import sys
from pathlib import Path

from attngeom.extract.loading.models import cache_dir   # no torch import

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

ROOT = TESTS.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


# fingerprint notes (extract/loading/fingerprint.py) that the tests' temporary model directories
# leave in the attngeom cache are removed after the session; the GGUF conversions there are kept
_FINGERPRINTS = cache_dir() / "fingerprints"
_BEFORE: set[Path] = set()


def pytest_sessionstart(session):
    _BEFORE.update(_FINGERPRINTS.glob("*"))


def pytest_sessionfinish(session, exitstatus):
    for note in set(_FINGERPRINTS.glob("*")) - _BEFORE:
        note.unlink(missing_ok=True)
