"""Moved to :mod:`attngeom.common.metrics`; this import path keeps working (the same module object)."""

import sys

from attngeom.common import metrics as _moved

sys.modules[__name__] = _moved
