"""Our attention methods applied to models we do not own (transformers)."""
