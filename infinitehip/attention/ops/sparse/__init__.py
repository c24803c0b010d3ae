"""Sparse attention over an explicit, head-shared key list per query block, reading the paged cache. The dispatch
and the full description: `op.py`."""
