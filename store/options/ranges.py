"""Moved to :mod:`attngeom.common.options.ranges`; this import path keeps working (the same module object)."""

import sys

from attngeom.common.options import ranges as _moved

sys.modules[__name__] = _moved
