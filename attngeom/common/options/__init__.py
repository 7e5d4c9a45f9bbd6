"""Every option of every stage, declared once.

:mod:`.stages` declares each stage's options (:class:`ExtractConfig`, :class:`FaithConfig`,
:class:`AnalysisOptions`, ...); argparse, the checks, config identity and provenance are made
from those declarations. :mod:`.spec` is how an option is declared, :mod:`.ranges` the range
syntax (``0-3,7``) of ``--layers`` and friends. The configs are re-exported here.
"""

from .stages import AnalysisOptions, ExtractConfig, FaithConfig, provenance

__all__ = ["AnalysisOptions", "ExtractConfig", "FaithConfig", "provenance"]
