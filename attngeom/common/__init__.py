"""The torch-free vocabulary every part of attngeom shares: the words and defaults
(:mod:`.vocab`), every option's declaration (:mod:`.options`), the faithfulness metric
registry (:mod:`.metrics`) and the errors a user can meet (:mod:`.errors`).

It imports nothing else of attngeom: extract, store, analysis, reports and the command line
all import it (``attngeom.store.options``, ``attngeom.store.format.metrics`` and
``attngeom.store.errors`` are the same modules under their earlier paths).
"""
