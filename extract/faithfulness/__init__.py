"""The faithfulness experiment: remove the keys each metric ranks first (or last), measure the loss.

:mod:`.experiment` runs it (``attngeom faithfulness``; :func:`faithfulness` is re-exported here);
:mod:`.interventions` is the handler inside attention (removal, zeroed sink values);
:mod:`.dense` the float32 attention every pass runs; :mod:`.removal_scores` the float32 scores
and their error bound; :mod:`.exact_scores` the float64 definition; :mod:`.layer_scores` the
scores of a layer by metric name and the rows recomputed at near-ties; :mod:`.selection` the
cut; :mod:`.scoring` what is scored (rows, spans, units); :mod:`.output` the per-unit results
of a block, handed to the store's result format.
"""

__all__ = ["faithfulness"]


def __getattr__(name: str):
    if name == "faithfulness":                  # lazily: experiment imports extract.run
        from .experiment import faithfulness

        return faithfulness
    raise AttributeError(f"module 'attngeom.extract.faithfulness' has no attribute '{name}'")
