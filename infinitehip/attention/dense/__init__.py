"""`dense`: exact causal attention over every cached token (`method.py`); no settings."""
