"""The decode step's key list: sink + the last stage's chunks (below the window) + the window, with RoPE positions.
The dispatch and the full description: `op.py`."""
