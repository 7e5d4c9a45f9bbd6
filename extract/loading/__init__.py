"""Models and inputs in: model specs and their fingerprint, text, image and task data."""
