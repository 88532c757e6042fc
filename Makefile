# kda-notebooks: `make notebooks` (execute + render every notebook) and `make test` (ruff + pytest).
SHELL := /bin/bash

# First Python >= 3.12 among python3.12, python3.13, python3 (and pyenv's installs, if any).
PYTHON_CANDIDATES := python3.12 python3.13 python3 $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3)
PYTHON ?= $(shell for c in $(PYTHON_CANDIDATES); do \
	  $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$c; break; }; done)

VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARAMS ?= ci
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
PYTEST_ARGS ?=

.PHONY: test notebooks lint sync clean check-python bench

check-python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: no Python >= 3.12 found (tried: $(PYTHON_CANDIDATES))."; \
	  echo "Install one (e.g. 'apt install python3.12', 'pyenv install 3.12', or conda: 'conda env create -f environment.yml')"; \
	  echo "or point to it: make test PYTHON=/path/to/python3.12"; exit 1; fi

$(STAMP): pyproject.toml | check-python
	@test -x $(VPY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check kda_lib tests notebooks data
	$(VENV)/bin/python -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

notebooks: $(STAMP)
	@mkdir -p build/notebooks build/html
	@for nb in $(NOTEBOOKS); do \
	  name=$$(basename $$nb .ipynb); \
	  echo "== $$name ($(PARAMS) parameters)"; \
	  start=$$(date +%s); \
	  params=notebooks/params/$(PARAMS)/$$name.yaml; opt=""; [ -f $$params ] && opt="-f $$params"; \
	  $(VENV)/bin/papermill --no-progress-bar -k python3 $$opt \
	    $$nb build/notebooks/$$name.ipynb || exit 1; \
	  $(VENV)/bin/jupyter nbconvert --log-level ERROR --to html --output-dir build/html \
	    build/notebooks/$$name.ipynb || exit 1; \
	  echo "   $$(( $$(date +%s) - start )) s"; \
	done
	@echo "executed notebooks: build/notebooks/   rendered HTML: build/html/"

sync: $(STAMP)
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

bench: $(STAMP)
	$(VPY) -m kda_lib.bench

clean:
	rm -rf build .pytest_cache .ruff_cache .hypothesis
