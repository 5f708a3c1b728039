# One entry point per job. Every target installs what it needs first, so each
# works as the first command typed on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODEL  ?= llama-3.1-8b
GPU    ?= H100-80GB
ARGS   ?=

.PHONY: install test lint tune bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Until the tuning loop lands: the startup plan and the utilization edge for MODEL on GPU.
tune: install
	$(BIN)/tuner plan --model '$(MODEL)' --gpu '$(GPU)' $(ARGS) || true
	$(BIN)/tuner plan --model '$(MODEL)' --gpu '$(GPU)' $(ARGS) --sweep gpu-memory-utilization

bench: install
	$(BIN)/python benchmarks/memory_accuracy.py
	$(BIN)/python benchmarks/sim_engine_speed.py
	$(BIN)/python benchmarks/sim_vs_published.py
	$(BIN)/python benchmarks/sim_serve_event_rate.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
