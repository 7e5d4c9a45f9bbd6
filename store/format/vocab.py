"""Moved to :mod:`attngeom.common.vocab`; this import path keeps working (the same module object)."""

import sys

from attngeom.common import vocab as _moved

sys.modules[__name__] = _moved
