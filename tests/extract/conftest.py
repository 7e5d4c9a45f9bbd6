"""Make the helpers of one test module here importable from another (test_removal_near.py reads
test_selection.py's reference rule)."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
