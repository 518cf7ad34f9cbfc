# The same targets locally and in CI.  `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help install install-dev run worker api test lint tiny-model clean

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: requirements.txt scripts/install.sh
	scripts/install.sh requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	scripts/install.sh requirements-dev.txt
	touch $@

install: $(VENV)/.installed  ## Create the venv and install the pinned runtime requirements.

install-dev: $(VENV)/.installed-dev  ## Also install the test and lint tools.

run: install  ## Start Redis, one worker and the API; Ctrl-C stops all.
	scripts/run.sh

worker: install  ## Start one worker per GPU (one on CPU) against $$REDIS_URL.
	$(PY) -m workers.launch

tiny-model: install  ## Build the tiny random-weight ChatTTS into models/chattts-tiny.
	$(PY) -m workers.engines.chattts_tiny models/chattts-tiny

test: install-dev  ## Run the whole test suite against a Redis and workers it starts itself.
	scripts/ensure_redis_server.sh
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install-dev  ## Run ruff and mypy.
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:  ## Remove run-time data (var/); keeps the venv and models.
	rm -rf var
