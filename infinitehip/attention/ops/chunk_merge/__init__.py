"""Joining a stage's chunk list with extra chunks of the same grid (question-time selection's chunks). The dispatch
and the full description: `op.py`."""
