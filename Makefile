# The same targets locally and in CI.  `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help install install-dev install-bench constraints run worker redis-ha test chaos chaos-failover lint tiny-model full-model bench-engine bench-real bench-fragments bench-modes bench-int8 bench-store gpu-check bench bench-batch bench-cache bench-stream bench-schedule bench-workers bench-goodput bench-held bench-text bench-textstream soak docs docs-build docs-reference clean

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/; s/\$$\$$/$$/g'

# Every install is held to constraints.txt: a new pin there reinstalls what it changes.
INSTALL_SCRIPTS := scripts/install.sh scripts/prereqs.sh constraints.txt

$(VENV)/.installed: requirements.txt $(INSTALL_SCRIPTS)
	scripts/install.sh requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt $(INSTALL_SCRIPTS)
	scripts/install.sh requirements-dev.txt
	touch $@

install: $(VENV)/.installed  ## Create the venv and install the pinned runtime requirements.

install-dev: $(VENV)/.installed-dev  ## Also install the test and lint tools.

$(VENV)/.installed-bench: $(VENV)/.installed-dev requirements-bench.txt $(INSTALL_SCRIPTS)
	scripts/install.sh requirements-bench.txt
	touch $@

install-bench: $(VENV)/.installed-bench  ## Also install what the benchmarks need (the chart).

# Installs unconstrained (so that a changed pin in requirements*.txt is taken up), then re-pins.
constraints:  ## After changing requirements*.txt: install them, then re-pin constraints.txt (all they pull in) from the venv.
	CONSTRAINTS= scripts/install.sh requirements.txt requirements-dev.txt $(if $(wildcard $(VENV)/.installed-bench),requirements-bench.txt)
	$(PY) scripts/pin_constraints.py

run: install  ## Start Redis, the worker and the API under supervisord, which restarts whichever dies; Ctrl-C stops all.
	scripts/run.sh

worker: install  ## Start one worker per GPU (one on CPU) against $$REDIS_URL, restarting any that dies.
	$(PY) -m workers.launch

tiny-model: install  ## Build the tiny random-weight ChatTTS into $$TTS_TINY_MODEL_DIR (default models/chattts-tiny).
	$(PY) -m workers.engines.chattts_tiny "$${TTS_TINY_MODEL_DIR:-models/chattts-tiny}"

full-model: install  ## Build the random-weight ChatTTS at its real sizes (1.1 GB, seeded, no download) into models/chattts-random.
	$(PY) -m workers.engines.chattts_random --preset full models/chattts-random

test: install-dev  ## Run the whole test suite against a Redis and workers it starts itself (of the failover scenarios, the primary's loss; all of them: make chaos-failover).
	scripts/ensure_redis_server.sh
	scripts/ensure_chromium.sh
	$(PY) -m pytest -m "not failover_more" $(PYTEST_ARGS)

chaos: install-dev  ## Run the fault-injection scenarios and print the table (zero lost jobs expected).
	scripts/ensure_redis_server.sh
	$(PY) -m pytest tests/chaos -m chaos -p no:cacheprovider -q; status=$$?; $(PY) -m tests.chaos.report; exit $$status

bench-store: install-bench  ## The job store's ceiling: the service's write path on one Redis (and a Sentinel group's primary) with an engine that makes audio at once; Redis CPU, network and memory per audio second, and the GPUs one primary serves (~2 min).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.store $(BENCH_ARGS)

chaos-failover: install-dev  ## Run the service on a Sentinel group (primary, 2 replicas, 3 Sentinels); kill the primary, freeze it past the failover, kill a Sentinel; print the table.
	scripts/ensure_redis_server.sh
	$(PY) -m pytest tests/chaos -m failover -p no:cacheprovider -q; status=$$?; $(PY) -m tests.chaos.report --failover; exit $$status

redis-ha: install  ## Start a local Sentinel group (a primary, two replicas, three Sentinels) and print the REDIS_URL for `make run`.
	scripts/ensure_redis_server.sh
	$(PY) -m devstack.sentinel

bench: install-bench  ## The headline benchmark: after vs before at 1, 10 and 50 callers, then the defaults vs the hand-tuned reference (table + chart).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.headline $(BENCH_ARGS)

bench-batch: install-bench  ## Batching on vs off at 16 concurrent segments; model pool load/evict/reload.
	$(PY) -m bench.batch

bench-cache: install-bench  ## Cache hits vs misses at 50 callers; an edited story re-rendered.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.cache

bench-stream: install-bench  ## Time to first audio: one sentence vs a 3,000-character text.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.stream

bench-schedule: install-bench  ## FIFO vs deadline scheduling at 10 and 50 callers (first audio, stalls, jobs/s).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.schedule $(BENCH_ARGS)

bench-workers: install-bench  ## One worker with two model hosts vs two workers with one each, at 10 and 20 callers (a job's segments split over workers; ~4 min).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.split_workers $(BENCH_ARGS)

bench-goodput: install-bench  ## Open-loop Poisson arrivals at 0.25-1.5x the measured capacity, FIFO and deadline: the rate at which no admitted listener stalls (~8 min).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.goodput $(BENCH_ARGS)

bench-held: install-bench  ## /healthz and POST /v1/jobs p50/p99 on `make run` while 1,000 event streams are held open.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.held_connections $(BENCH_ARGS)

bench-fragments: full-model install-bench  ## Audio in fragments: first audio, fragment lengths, gaps and jobs/s, on vs off, full-size and tiny ChatTTS (~15 min); then the join-quality table (WEIGHTS=dir for real weights).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.fragments $(BENCH_ARGS)
	$(PY) -m bench.fragment_joins $(if $(WEIGHTS),--weights $(WEIGHTS))

bench-engine: full-model install-bench  ## The real-size engine on this machine: batch 1-32 in fp32 and int8, stage shares, best torch threads and replicas; then the matrix-maths ceiling on batching (30 s); then the static decode step against today's loop at batch 1/4/16 (~4 min).
	$(PY) -m bench.engine_real $(BENCH_ARGS)
	$(PY) -m bench.matmul_ceiling
	$(PY) -m bench.static_step

bench-modes: full-model install-bench  ## fast (int8) beside balanced on the full-size ChatTTS, one stack at the defaults: 1/4/16 callers (~20 min).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.modes $(BENCH_ARGS)

bench-int8: full-model install-bench  ## int8 against fp32 on the same prompts and seeds: tokens agreed, logit KL and top-k, audio SNR; with WEIGHTS=dir (real weights) also Whisper's character error rate of each.
	$(PY) -m bench.int8_divergence $(if $(WEIGHTS),--weights $(WEIGHTS))

bench-real: full-model install-bench  ## The headline at real size (chattts-random, short texts, 120 s levels, ~30 min): 1/10/16/50 callers, baseline, batching off at 16.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.headline --real-size $(BENCH_ARGS)

gpu-check: full-model install-bench  ## On a GPU (sized for 8 min; BENCH_ARGS=--rehearse on a CPU): real-size engine in fp32/fp16/bf16 with CUDA graphs off and on, then the service on cuda:0 at 1/16/64 callers.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.gpu_check $(BENCH_ARGS)

bench-textstream: install-bench  ## Text streams fed at 30 tokens/s vs whole jobs of the same sentences, at 1 and 10 callers, each way in after 30 s of whole jobs as its reference (~12.5 min).
	scripts/ensure_redis_server.sh
	$(PY) -m bench.text_stream $(BENCH_ARGS)

bench-text: install-bench  ## Adversarial texts at the length limit through validation and planning (each under 50 ms).
	$(PY) -m bench.text_adversarial $(BENCH_ARGS)

soak: install-bench  ## Saturate a `make run` stack for SOAK_MINUTES (30): Redis memory, RSS, jobs/s, errors over time.
	scripts/ensure_redis_server.sh
	$(PY) -m bench.soak $(BENCH_ARGS)

lint: install-dev docs-build  ## Run ruff and mypy, and build the docs strictly (a broken link fails).
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

docs-reference: install-dev  ## Regenerate the configuration reference (docs/operations/configuration-reference.md).
	$(PY) -m scripts.config_reference

docs: docs-reference  ## Serve the docs site on $$MKDOCS_ADDR (default 127.0.0.1:8001, beside make run), rebuilding on edits.
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr "$${MKDOCS_ADDR:-127.0.0.1:8001}"

docs-build: install-dev  ## Build the docs site into build/site with --strict; fails if the configuration reference is stale.
	$(PY) -m scripts.config_reference --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:  ## Remove run-time data (var/); keeps the venv and models.
	rm -rf var
