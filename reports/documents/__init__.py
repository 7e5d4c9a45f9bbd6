"""Documents: the report PDF of one store (:mod:`.report`, gathering its inputs with :mod:`.load`) and the comparison of several (:mod:`.compare`)."""
