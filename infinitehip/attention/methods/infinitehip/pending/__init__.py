"""Queue decode queries for the deferred landmark saliency update (deferred_saliency.py): one launch per step for a
whole batch. The dispatch and the full description: `op.py`."""
