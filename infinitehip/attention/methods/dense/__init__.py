"""`dense`: exact causal attention over every cached token (`method.py`; its batched decode op: `paged_decode/`); no
settings."""
