"""Attention over sinks + sub-caches + stride that also accumulates each key's score (the EMA of the attention it
receives, reduced over its KV group's query heads). The dispatch and the full description: `op.py`; a decode query
over every slot under a mask (static shapes, for CUDA graphs): `masked.py`."""
