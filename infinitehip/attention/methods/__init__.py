"""The attention methods, one folder each, named as `--method` names them (the registry: config/methods.py)."""
