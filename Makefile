# Two set-up commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck bench bench-peers clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.base
	$(PY) examples/stages.py

test: $(VENV)/.test
	$(PY) -m pytest -q -p no:cacheprovider
	$(PY) -m mypy
	$(PY) -m ruff check raf tests benchmarks examples

bench: $(VENV)/.base
	$(PY) benchmarks/bench_pipeline.py

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
