"""`truncate`: the Truncated-FA2 baseline (head + tail of an over-long prompt, then dense); `config.py`
(TruncateConfig), `method.py`."""
