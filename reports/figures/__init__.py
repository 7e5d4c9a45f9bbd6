"""The report's figures: one module per section, each returning its pages
(:class:`attngeom.reports.style.Page`); :mod:`attngeom.reports.documents.report` orders them."""

from . import (anti_alignment, convexity, decomposition, drift, example, faithfulness,  # noqa
               sink_strip, sinks)
