"""The decode steps' landmark saliency (saliency.py `update_decode`): the queued queries' logits added to the keys
of their windows, applied at a mask refresh. Sync-free, static shapes. The dispatch and the full description:
`op.py`."""
