"""Model in, measurements out: the only part of attngeom that imports torch.

- :mod:`.run`: the extraction run (``attngeom extract``): texts in, a complete store out.
- :mod:`.loading`: model specs (hub id, directory, ``.gguf``, built-in names) and their weight
  fingerprint; text, image and evaluation-task data.
- :mod:`.measurement`: hooks into transformers' attention registry, discovery of each layer's
  heads and W_O, the head-space geometry, one layer's measurement (:mod:`.measurement.layer`),
  the whole-model capture (:mod:`.measurement.capture`) and ``attngeom.measure``
  (:mod:`.measurement.inmemory`).
- :mod:`.faithfulness`: the removal experiment and the sink-value intervention.

Every file a run writes goes through :mod:`attngeom.store`.
"""
