"""Representative (landmark) scores of key chunks: the Triton kernel (`triton.py`) and the CPU formulation
(`cpu.py`); their eager reference and the dispatch are the scoring op's (`../reference.py`, `../op.py`)."""
