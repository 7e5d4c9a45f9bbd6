"""Moved to :mod:`attngeom.common.errors`; this import path keeps working (the same module object)."""

import sys

from attngeom.common import errors as _moved

sys.modules[__name__] = _moved
