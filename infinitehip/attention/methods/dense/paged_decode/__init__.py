"""Paged dense decode: one new query per sequence over its whole paged cache, keys rotated when read (`op.py`). The
dispatch and the full description: `op.py`."""
