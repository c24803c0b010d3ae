"""The suites of `python -m bench` (bench/cli.py lists them)."""
