"""Keep a decode stage's top chunks, in position order (the end of a pruning stage in the sync-free decode step).
The dispatch and the full description: `op.py`."""
