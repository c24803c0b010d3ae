"""Rotation of queries or keys by RoPE angles gathered at given positions, as one op: eager reference and one Triton
kernel. The dispatch and the full description: `op.py`."""
