"""`hip` (HiP attention v1): hierarchical top-k key blocks with center representatives; `config.py` (HiPConfig,
presets), `hierarchy.py` (the top-k estimation and its eager reference), `key_list.py` (the attention op's key
lists), `state.py` (the kept decode selections), `graph_hooks.py` (CUDA-graph decode), `method.py`."""
