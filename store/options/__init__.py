"""Moved to :mod:`attngeom.common.options`; this import path keeps working: its modules
(``attngeom.store.options.stages``, ``.spec``, ``.ranges``) are the same module objects."""

from attngeom.common.options import *  # noqa: F401,F403
from attngeom.common.options import __all__  # noqa: F401
