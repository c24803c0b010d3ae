"""Attention ops shared by several methods: each a folder of `op.py` (the dispatch), `triton.py` and `reference.py`."""
