"""`streaming` (StreamingLLM): attention sinks + a sliding window; `config.py` (StreamingConfig), `method.py`."""
