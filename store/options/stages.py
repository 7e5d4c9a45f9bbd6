"""Moved to :mod:`attngeom.common.options.stages`; this import path keeps working (the same module object)."""

import sys

from attngeom.common.options import stages as _moved

sys.modules[__name__] = _moved
