"""The prefill's landmark saliency sums (saliency.py `KeySaliency.update`): op.py dispatches."""
