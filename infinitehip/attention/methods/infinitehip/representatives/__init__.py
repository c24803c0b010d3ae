"""Landmark representatives: the most salient token of each (deduplicated) chunk per head. The dispatch and the full
description: `op.py`."""
