"""Moved to :mod:`attngeom.common.atomic`; this import path keeps working (the same module object)."""

import sys

from attngeom.common import atomic as _moved

sys.modules[__name__] = _moved
