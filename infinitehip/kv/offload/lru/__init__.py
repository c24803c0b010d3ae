"""The LRU bank resolve as Triton kernels (`triton.py`); the dispatch and the eager oracle are `../resolve.py`."""
