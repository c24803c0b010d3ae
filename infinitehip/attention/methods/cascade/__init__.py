"""`cascade` (Cascading KV Cache): sinks plus cascading circular sub-caches of a fixed size; `config.py`
(CascadeConfig, presets), `schedule.py` (the shared acceptance schedule and positions), `update/` (the cache
update kernel and its reference), `scores.py` (attention with the score EMA), `method.py`."""
