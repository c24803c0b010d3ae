"""`auto`: dense within the model's trained length, InfiniteHiP beyond it (`method.py`, presets in `presets.py`)."""
