"""Shared test setup: make the helper modules in tests/ importable from every subfolder."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

ROOT = TESTS.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
