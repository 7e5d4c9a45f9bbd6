"""The torch-free vocabulary every part of attngeom shares: the words and defaults
(:mod:`.vocab`), every option's declaration (:mod:`.options`), the faithfulness metric
registry (:mod:`.metrics`), the errors a user can meet (:mod:`.errors`), atomic files
(:mod:`.atomic`) and how a command stops on SIGINT or SIGTERM (:mod:`.interrupts`).

It imports nothing else of attngeom: extract, store, analysis, reports and the command line
all import it (``attngeom.store.options``, ``attngeom.store.format.metrics`` and
``attngeom.store.errors`` are the same modules under their earlier paths).
"""
