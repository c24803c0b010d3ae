"""InfiniPot (paper 001, Continual Context Distillation): `config.py` (InfiniPotConfig, presets), `distill.py`,
`method.py` (the attention method)."""
