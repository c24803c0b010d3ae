"""Chunk scoring of one InfiniteHiP pruning stage (paper Alg. 2 lines 6-11 with SelectRep, Alg. 3). The dispatch and
the full description: `op.py`."""
