"""What the suites share: flags (cli.py), model loading (models.py), the JSON meta block and result file
(meta.py), timing (timing.py), and the benchmark-only instrumentation of the engine (instrument.py)."""
