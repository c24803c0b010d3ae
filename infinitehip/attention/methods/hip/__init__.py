"""`hip` (HiP attention v1): hierarchical top-k key blocks with center representatives; `config.py` (HiPConfig,
presets), `hierarchy.py` (the top-k estimation and its eager reference), `method.py`."""
