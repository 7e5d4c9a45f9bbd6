"""Moved to :mod:`attngeom.common.options.spec`; this import path keeps working (the same module object)."""

import sys

from attngeom.common.options import spec as _moved

sys.modules[__name__] = _moved
