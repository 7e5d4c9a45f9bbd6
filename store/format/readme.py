"""Moved to :mod:`attngeom.store.io.readme`; this import path keeps working (the same module object)."""

import sys

from attngeom.store.io import readme as _moved

sys.modules[__name__] = _moved
