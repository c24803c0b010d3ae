"""The question's summed soft vote: many queries over the same candidates of one sequence (question-time selection).
The dispatch and the full description: `op.py`."""
