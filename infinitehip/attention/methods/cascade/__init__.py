"""`cascade` (Cascading KV Cache): sinks plus cascading circular sub-caches of a fixed size; `config.py`
(CascadeConfig, presets), `schedule.py` (the shared acceptance schedule and positions), `update/` (the cache
update kernel and its reference), `scores/` (attention with the score EMA), `decode.py` (the static-shape decode
step's keys), `graph_hooks.py` (CUDA-graph decode), `method.py`."""
