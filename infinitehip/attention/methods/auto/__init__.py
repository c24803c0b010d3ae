"""`auto`: dense up to half the model's trained length, InfiniteHiP beyond (`method.py`, presets in `presets.py`)."""
