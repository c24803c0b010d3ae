"""TokenSelect (paper 002): token-level KV selection by per-head soft vote, with a decode Selection Cache.

`config.py` holds TokenSelectConfig and its presets, `method.py` the attention method, `soft_vote/` the vote op."""
