"""Queue a decode query for the deferred landmark saliency update (method._apply_saliency): one launch per step. The
dispatch and the full description: `op.py`."""
