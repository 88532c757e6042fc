# kda-notebooks: `make notebooks` (execute every notebook, build the site) and `make test`.
SHELL := /bin/bash

# First Python >= 3.12 among python3.12, python3.13, python3 (and pyenv's installs, if any).
PYTHON_CANDIDATES := python3.12 python3.13 python3 $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3)
PYTHON ?= $(shell for c in $(PYTHON_CANDIDATES); do \
	  $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$c; break; }; done)

VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the extras installed into .venv: add `tpu` on a TPU VM, `gpu` (CUDA 13) or `cuda12` on a GPU host.
# JupyterLab (the `jupyter` extra) only where `make lab` asks for it: its dependencies slow
# every notebook run's start (jsonschema's URI grammar alone takes 2 s to import)
EXTRAS ?= dev
# the exact versions CI tests (`make lock` regenerates them); pyproject.toml holds the ranges
CONSTRAINTS := constraints.txt
PARAMS ?= ci
# seconds one notebook cell may run under `make notebooks` before it counts as hung
CELL_TIMEOUT ?= 1200
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
EXECUTED := $(patsubst notebooks/%,build/notebooks/%,$(NOTEBOOKS))
PYTEST_ARGS ?=

.PHONY: test notebooks site lab lint sync lock repository-url clean check-python bench FORCE

check-python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: no Python >= 3.12 found (tried: $(PYTHON_CANDIDATES))."; \
	  echo "Install one (e.g. 'apt install python3.12', 'pyenv install 3.12', or conda: 'conda env create -f environment.yml')"; \
	  echo "or point to it: make test PYTHON=/path/to/python3.12"; exit 1; fi

# rewritten only when EXTRAS changes, so that a new EXTRAS reinstalls
$(VENV)/.extras: FORCE
	@mkdir -p $(VENV); echo '$(EXTRAS)' | cmp -s - $@ || echo '$(EXTRAS)' > $@

# uv installs in parallel (about 30 s instead of 80 s here); pip installs uv itself, so pip's
# own settings (index, proxy) find it. INSTALLER=pip skips uv; where uv fails (e.g. an index
# only pip is configured for), pip retries, saying so.
INSTALLER ?= uv
$(STAMP): pyproject.toml $(CONSTRAINTS) $(VENV)/.extras | check-python
	@test -x $(VPY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(VPY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip $(filter uv,$(INSTALLER))
	@if [ "$(INSTALLER)" = uv ]; then \
	  echo "$(VENV)/bin/uv pip install -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'"; \
	  $(VENV)/bin/uv pip install -q --python $(VPY) --compile-bytecode -c $(CONSTRAINTS) \
	    -e '.[$(EXTRAS)]' || { echo "uv could not install the environment; retrying with pip"; \
	  $(VPY) -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'; }; \
	else $(VPY) -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'; fi
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check kda_lib tests notebooks data scripts

test: lint
	$(VPY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# execute every notebook with papermill (PARAMS=full: the bigger settings of notebooks/params/full/),
# then render build/notebooks/ into the static site build/html/
notebooks: $(STAMP)
	@mkdir -p build/notebooks
	@for nb in $(NOTEBOOKS); do \
	  name=$$(basename $$nb .ipynb); \
	  echo "== $$name ($(PARAMS) parameters)"; \
	  start=$$(date +%s); \
	  params=notebooks/params/$(PARAMS)/$$name.yaml; opt=""; [ -f $$params ] && opt="-f $$params"; \
	  $(VENV)/bin/papermill --no-progress-bar --execution-timeout $(CELL_TIMEOUT) -k python3 $$opt \
	    $$nb build/notebooks/$$name.ipynb || exit 1; \
	  echo "   $$(( $$(date +%s) - start )) s"; \
	done
	$(VPY) scripts/build_site.py $(EXECUTED) --output build/html

# the site again from the notebooks already executed in build/notebooks/
site: $(STAMP)
	$(VPY) scripts/build_site.py $(EXECUTED) --output build/html

# JupyterLab on the notebooks: adds the `jupyter` extra to .venv first (LAB_ARGS: e.g.
# --no-browser --port 8888 on a remote VM)
lab: | check-python
	@$(MAKE) --no-print-directory $(STAMP) EXTRAS=$(EXTRAS),jupyter
	$(VENV)/bin/jupyter lab $(LAB_ARGS) notebooks/

sync: $(STAMP)
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

# publish under another address: make repository-url URL=https://github.com/OWNER/NAME
repository-url: $(STAMP)
	@test -n "$(URL)" || { echo "usage: make repository-url URL=https://github.com/OWNER/NAME"; exit 1; }
	$(VPY) scripts/notebook_setup.py --set-repository-url '$(URL)'
	$(VENV)/bin/jupytext --sync notebooks/[0-9][0-9]_*.py

# the newest versions pyproject.toml allows, installed into a scratch venv and written to
# constraints.txt; run `make test` afterwards to see whether they still pass
lock: | check-python
	rm -rf build/lock-venv
	$(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/pip install -q --upgrade pip uv
	build/lock-venv/bin/pip install -q '.[dev,jupyter]'
	{ echo "# Exact versions CI tests (make test installs with them); pyproject.toml has the ranges."; \
	  echo "# Regenerate with 'make lock'; the accelerator extras resolve against these pins."; \
	  build/lock-venv/bin/pip freeze --all --exclude kda-lib; } > $(CONSTRAINTS)
	rm -rf build/lock-venv

bench: $(STAMP)
	$(VPY) -m kda_lib.bench

clean:
	rm -rf build .pytest_cache .ruff_cache .hypothesis
