"""The measurement: hooks into the attention registry, discovery of each layer, the
geometry, one layer's measurement, the whole-model capture and ``attngeom.measure``."""
