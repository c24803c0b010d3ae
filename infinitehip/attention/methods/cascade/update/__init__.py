"""Pushing a stride's tokens through the sub-caches (schedule.py's plan), every layer and KV head at once. The
dispatch and the full description: `op.py`."""
