# Two set-up commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck bench bench-openai bench-redis bench-scale bench-peers redis-server clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.redis: $(VENV)/.base
	$(PY) -m pip install -q -e '.[redis]'
	touch $@

# The Redis tests and benchmark start their own redis-server on a free loopback port
# (and stop it); this only installs the program, from Debian's packages, when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
redis-server:
	@command -v redis-server >/dev/null || ( \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null)

demo: $(VENV)/.base
	@rm -f .raf/demo.db .raf/demo.db-wal .raf/demo.db-shm
	@echo '$$ raf run examples/agent.toml "hello" --session demo --db .raf/demo.db --trace'
	@$(VENV)/bin/raf run examples/agent.toml "hello" --session demo --db .raf/demo.db --trace
	@echo
	@echo '$$ raf run examples/agent.toml "and again" --session demo --db .raf/demo.db --trace'
	@$(VENV)/bin/raf run examples/agent.toml "and again" --session demo --db .raf/demo.db --trace
	@echo
	@echo '$$ python examples/stages.py   # the order of the stages, and what the model sees'
	@$(PY) examples/stages.py

# The suite on TEST_WORKERS processes (pytest-xdist): many tests wait on subprocesses and
# sockets, so 4 workers keep a 2-core machine busy; worksteal hands the last slow tests of a
# busy worker to an idle one. `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 4
test: $(VENV)/.test redis-server
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal --durations=15
	$(PY) -m mypy
	$(PY) -m ruff check .

bench: $(VENV)/.redis redis-server
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/bench_redis.py
	$(PY) benchmarks/bench_scale.py

# A turn over 1,000 and 100,000 stored messages on each store, import time, a provider
# layer, and 1, 2, 4 workers on one redis-server or SQLite file (docs/performance.md, Scale).
bench-scale: $(VENV)/.redis redis-server
	$(PY) benchmarks/bench_scale.py

bench-redis: $(VENV)/.redis redis-server
	$(PY) benchmarks/bench_redis.py

# A turn over a long history through OpenAIChatClient, against a plain httpx POST (loopback).
bench-openai: $(VENV)/.base
	$(PY) benchmarks/bench_openai.py

# Peers live in their own virtualenv: they are never dependencies of raf.
PEERS_VENV := benchmarks/.peers-venv
$(PEERS_VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -e . agent-framework-core langchain pydantic-ai-slim
	touch $@

bench-peers: $(PEERS_VENV)/.ready
	$(PEERS_VENV)/bin/python benchmarks/bench_peers.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
