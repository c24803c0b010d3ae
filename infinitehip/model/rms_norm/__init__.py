"""RMSNorm as the model families compute it, as one op: eager reference and one Triton kernel. The dispatch and the
full description: `op.py`."""
