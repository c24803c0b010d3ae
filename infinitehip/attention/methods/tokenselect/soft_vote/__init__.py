"""TokenSelect's soft vote: the dispatch `op.py`, the kernels `triton.py`, the oracle `reference.py`."""
