# Everything a new machine needs is installed by these targets, from this repository's own files.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# The top-level folder `operator/` shares its name with the standard library's module; with the
# repository as the current directory, `python -m ...` would import the folder instead. Python
# 3.11's safe-path mode keeps the current directory off sys.path (`batchd serve` adds its
# --app-dir back on purpose, after the standard library is loaded).
export PYTHONSAFEPATH := 1

.PHONY: demo test bench lint tools install clean

install: $(VENV)/.installed

# The venv is rebuilt whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Test-only tools from Debian: a real Prometheus (and promtool) for the metrics tests.
tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q --no-install-recommends prometheus; }

# The main job: serve the bundled MiniLM model locally and show what batching does.
demo: install
	$(PY) -m batchd.bench.demo

test: install tools
	$(PY) -m pytest

bench: install
	$(PY) -m batchd.bench

# mypy cannot follow setuptools' editable-install import hook, so it reads the packages
# through a tree of links laid out as they are imported (batchd/api -> api/, ...).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf build/typecheck && mkdir -p build/typecheck/batchd
	for d in api replica operator bench; do ln -s ../../../$$d build/typecheck/batchd/$$d; done
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p batchd
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
