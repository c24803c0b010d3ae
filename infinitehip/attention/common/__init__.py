"""Building blocks several methods share (soft-capping, sliding windows, question selection, repeated text, ...)."""
