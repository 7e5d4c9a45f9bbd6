"""The interactive view: one self-contained HTML page of a store or measurement
(:mod:`.page` builds it; :mod:`.data` the numbers it embeds; ``assets/`` its JS and CSS)."""

from .page import build, view  # noqa: F401
