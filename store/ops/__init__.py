"""Operations on whole stores: merge, subset, export (and its Hub card), info."""
